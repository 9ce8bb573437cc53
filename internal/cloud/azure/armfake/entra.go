// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package armfake

import (
	"fmt"
	"net/http"
	"strings"
)

// The fake is also a Microsoft Entra ID authority for one tenant, as
// MSAL (under azidentity's client secret credential) calls it: the
// tenant's OpenID configuration and its token endpoint, client
// credentials grant only. Once SetClient names the one client it knows,
// ARM requests must carry a token it issued, as ARM refuses others.

// Tenant is the fake authority's only tenant.
const Tenant = "00000000-0000-0000-0000-0000000000aa"

// SetClient makes the token endpoint accept client id with secret, and
// ARM require its tokens.
func (s *Server) SetClient(id, secret string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.clientID, s.clientSecret = id, secret
	if s.tokens == nil {
		s.tokens = map[string]bool{}
	}
}

// Tokens answers how many tokens the authority issued.
func (s *Server) Tokens() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.tokens)
}

// serveEntraLocked answers an authority request; false when path is none.
func (s *Server) serveEntraLocked(w http.ResponseWriter, r *http.Request, path string) bool {
	base := s.base + "/" + Tenant
	switch {
	case path == "/"+Tenant+"/v2.0/.well-known/openid-configuration" && r.Method == http.MethodGet:
		writeJSON(w, http.StatusOK, map[string]string{
			"token_endpoint":         base + "/oauth2/v2.0/token",
			"issuer":                 base + "/v2.0",
			"authorization_endpoint": base + "/oauth2/v2.0/authorize",
		})
	case path == "/"+Tenant+"/oauth2/v2.0/token" && r.Method == http.MethodPost:
		if err := r.ParseForm(); err != nil || r.PostForm.Get("grant_type") != "client_credentials" {
			writeOAuthError(w, http.StatusBadRequest, "unsupported_grant_type", "AADSTS70003: The app requested an unsupported grant type.")
			return true
		}
		if s.clientID == "" || r.PostForm.Get("client_id") != s.clientID || r.PostForm.Get("client_secret") != s.clientSecret {
			writeOAuthError(w, http.StatusUnauthorized, "invalid_client", "AADSTS7000215: Invalid client secret provided.")
			return true
		}
		token := fmt.Sprintf("fake-token-%d", len(s.tokens)+1)
		s.tokens[token] = true
		writeJSON(w, http.StatusOK, map[string]any{"token_type": "Bearer", "expires_in": 3600, "ext_expires_in": 3600, "access_token": token})
	case strings.HasPrefix(path, "/"+Tenant+"/"):
		writeOAuthError(w, http.StatusNotFound, "invalid_request", "The fake authority serves no "+r.Method+" "+path)
	default:
		return false
	}
	return true
}

// authorizedLocked reports whether r may reach ARM: any request until
// SetClient, then one with a token the authority issued.
func (s *Server) authorizedLocked(r *http.Request) bool {
	if s.tokens == nil {
		return true
	}
	token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	return ok && s.tokens[token]
}

func writeOAuthError(w http.ResponseWriter, status int, code, description string) {
	writeJSON(w, status, map[string]string{"error": code, "error_description": description})
}
