{{/*
Names. With the release named after the chart (helm install ipam ...) the
objects get the names of deploy/kubernetes and deploy/kube-access:
ipam-server, ipam-server-tls, ipam-server-cilium-operator, ipam-cni...
*/}}
{{- define "ipam.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" -}}
{{- else if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* The server's Deployment, Service, PodDisruptionBudget and roles. */}}
{{- define "ipam.server" -}}
{{- printf "%s-server" (include "ipam.fullname" .) -}}
{{- end -}}

{{- define "ipam.serviceAccountName" -}}
{{- .Values.serviceAccount.name | default (include "ipam.server" .) -}}
{{- end -}}

{{/*
Labels. Only the app.kubernetes.io ones: the chart renders deploy/kubernetes
too, which kubectl applies, so no label claims that Helm manages an object
(Helm itself keeps its release in annotations it adds at install).
*/}}
{{- define "ipam.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "ipam.labels" -}}
{{ include "ipam.selectorLabels" . }}
app.kubernetes.io/part-of: {{ .Chart.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end -}}

{{/* Labels of the server's objects; the selector adds the component. */}}
{{- define "ipam.serverLabels" -}}
{{ include "ipam.labels" . }}
app.kubernetes.io/component: server
{{- end -}}

{{- define "ipam.serverSelectorLabels" -}}
{{ include "ipam.selectorLabels" . }}
app.kubernetes.io/component: server
{{- end -}}

{{- define "ipam.cniLabels" -}}
{{ include "ipam.labels" . }}
app.kubernetes.io/component: cni
{{- end -}}

{{- define "ipam.cniSelectorLabels" -}}
{{ include "ipam.selectorLabels" . }}
app.kubernetes.io/component: cni
{{- end -}}

{{/* An image reference: a digest wins over a tag; the tag defaults to the chart's appVersion. */}}
{{- define "ipam.image" -}}
{{- if .digest -}}
{{- printf "%s@%s" .repository .digest -}}
{{- else -}}
{{- printf "%s:%s" .repository (.tag | default .appVersion) -}}
{{- end -}}
{{- end -}}

{{/* Secrets: the chart's own when it is given their content, else existing ones. */}}
{{- define "ipam.databaseSecret" -}}
{{- if .Values.database.url -}}
{{- printf "%s-database" (include "ipam.fullname" .) -}}
{{- else -}}
{{- .Values.database.existingSecret | default (printf "%s-database" (include "ipam.fullname" .)) -}}
{{- end -}}
{{- end -}}

{{- define "ipam.tlsSecret" -}}
{{- if .Values.tls.cert -}}
{{- printf "%s-tls" (include "ipam.server" .) -}}
{{- else -}}
{{- .Values.tls.existingSecret | default (printf "%s-tls" (include "ipam.server" .)) -}}
{{- end -}}
{{- end -}}

{{- define "ipam.bootstrapTokenSecret" -}}
{{- .Values.bootstrapToken.existingSecret | default (printf "%s-bootstrap-token" (include "ipam.fullname" .)) -}}
{{- end -}}

{{/*
Kubernetes access: every controller of the server reads the cluster with
the Pod's service account (--kube-in-cluster), which also starts the Pod
and namespace metadata informers of pool selection; the RBAC of each comes
with it (templates/rbac.yaml).
*/}}
{{- define "ipam.kubeAccess" -}}
{{- if or .Values.kubernetes.podMetadata .Values.ciliumOperator.mode .Values.lbipam.enabled -}}
true
{{- end -}}
{{- end -}}

{{/* Leader election: the Cilium operator role and LB IPAM each hold a Lease in the release's namespace. */}}
{{- define "ipam.leaderElection" -}}
{{- if or .Values.ciliumOperator.mode .Values.lbipam.enabled -}}
true
{{- end -}}
{{- end -}}

{{/*
Checks across values that values.schema.json cannot express; each fails the
render with the fix. Included once, by the Deployment.
*/}}
{{- define "ipam.validate" -}}
{{- $v := .Values -}}
{{- range $what, $image := dict "image" $v.image "cni.image" $v.cni.image -}}
{{- if and (eq $image.tag "latest") (not $image.digest) -}}
{{- fail (printf "%s.tag latest moves under you: pin a release tag or a digest" $what) -}}
{{- end -}}
{{- end -}}
{{- if and $v.database.url $v.database.existingSecret -}}
{{- fail "database: set url (the chart creates the Secret) or existingSecret (you create it), not both" -}}
{{- end -}}
{{- if and $v.tls.existingSecret (or $v.tls.cert $v.tls.key $v.tls.ca) -}}
{{- fail "tls: set cert, key and ca (the chart creates the Secret) or existingSecret (you create it), not both" -}}
{{- end -}}
{{- if and (or $v.tls.cert $v.tls.key $v.tls.ca) (not (and $v.tls.cert $v.tls.key $v.tls.ca)) -}}
{{- fail "tls: cert, key and ca go together (PEM: the server certificate, its key, and the CA of the client certificates the API accepts)" -}}
{{- end -}}
{{- if and $v.bootstrapToken.existingSecret $v.bootstrapToken.value -}}
{{- fail "bootstrapToken: set value (the chart creates the Secret) or existingSecret (you create it), not both" -}}
{{- end -}}
{{- if and $v.podDisruptionBudget.enabled (lt (int $v.replicaCount) 2) -}}
{{- fail (printf "replicaCount %d with podDisruptionBudget.enabled: the budget would block every node drain; run at least 2 replicas, or set podDisruptionBudget.enabled=false" (int $v.replicaCount)) -}}
{{- end -}}
{{- with $v.podDisruptionBudget -}}
{{- if and .enabled (not (kindIs "invalid" .minAvailable)) (not (kindIs "invalid" .maxUnavailable)) -}}
{{- fail "podDisruptionBudget: set minAvailable or maxUnavailable, not both" -}}
{{- end -}}
{{- if and .enabled (not (kindIs "invalid" .minAvailable)) (not (kindIs "string" .minAvailable)) (ge (int .minAvailable) (int $v.replicaCount)) -}}
{{- fail (printf "podDisruptionBudget.minAvailable %d of %d replicas: no Pod could ever be evicted, and node drains would hang" (int .minAvailable) (int $v.replicaCount)) -}}
{{- end -}}
{{- end -}}
{{- if and (or $v.lbipam.nodeIPAM $v.lbipam.mirror) (not $v.lbipam.enabled) -}}
{{- fail "lbipam.nodeIPAM and lbipam.mirror run in the LB IPAM controller: set lbipam.enabled too" -}}
{{- end -}}
{{- if and (eq $v.lbipam.defaultIPAM "nodeipam") (not $v.lbipam.nodeIPAM) -}}
{{- fail "lbipam.defaultIPAM nodeipam needs lbipam.nodeIPAM" -}}
{{- end -}}
{{- if eq $v.cloud.provider "aws" -}}
{{- $_ := required "cloud.provider aws needs cloud.aws.region" $v.cloud.aws.region -}}
{{- end -}}
{{- if eq $v.cloud.provider "azure" -}}
{{- $_ := required "cloud.provider azure needs cloud.azure.subscription" $v.cloud.azure.subscription -}}
{{- end -}}
{{- if $v.cni.enabled -}}
{{- $_ := required "cni.enabled needs cni.server: the HTTPS address of the server that the nodes' own resolver and network reach (not a *.svc name), e.g. https://ipam.example.internal:8443" $v.cni.server -}}
{{- if not (regexMatch "^https://[^/]+" $v.cni.server) -}}
{{- fail (printf "cni.server %q: want https://HOST[:PORT] (the plugin speaks mutual TLS only)" $v.cni.server) -}}
{{- end -}}
{{- if regexMatch "^https://[^/:]+\\.(svc|cluster\\.local)([:/]|$)" $v.cni.server -}}
{{- fail (printf "cni.server %q: the plugin runs in the host's network namespace, whose resolver does not know cluster DNS names; use an address outside the cluster DNS" $v.cni.server) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
The rules of the one object of a kind in a file of deploy/kube-access
(files/kube-access links there): (list $ FILE KIND). A file without such an
object fails the render rather than grant nothing.
*/}}
{{- define "ipam.rulesOf" -}}
{{- $root := index . 0 -}}
{{- $file := printf "files/kube-access/%s" (index . 1) -}}
{{- $kind := index . 2 -}}
{{- $rules := list -}}
{{- $found := 0 -}}
{{- range splitList "\n---\n" ($root.Files.Get $file) -}}
{{- $o := fromYaml . -}}
{{- if $o.Error -}}
{{- fail (printf "%s: %s" $file $o.Error) -}}
{{- end -}}
{{- if eq ($o.kind | default "") $kind -}}
{{- $rules = $o.rules -}}
{{- $found = add1 $found -}}
{{- end -}}
{{- end -}}
{{- if ne (int $found) 1 -}}
{{- fail (printf "%s holds %d objects of kind %s; want one (is files/kube-access a link to deploy/kube-access?)" $file (int $found) $kind) -}}
{{- end -}}
{{- toYaml $rules -}}
{{- end -}}
