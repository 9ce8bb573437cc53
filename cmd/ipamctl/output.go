// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"sigs.k8s.io/yaml"
)

// structured prints v as JSON or YAML when -o asks for one and answers
// true; for a table it answers false and the command draws its own.
// YAML goes through the JSON encoding, so both show the API's field names
// (the generated types carry json tags only).
func (a *app) structured(v any) (bool, error) {
	switch a.conn.output {
	case "json":
		enc := json.NewEncoder(a.stdout)
		enc.SetIndent("", "  ")
		return true, enc.Encode(v)
	case "yaml":
		b, err := yaml.Marshal(v)
		if err != nil {
			return true, err
		}
		_, err = a.stdout.Write(b)
		return true, err
	}
	return false, nil
}

// table is a tab-separated table written through text/tabwriter.
type table struct{ tw *tabwriter.Writer }

func newTable(w io.Writer, header ...string) *table {
	t := &table{tw: tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)}
	if len(header) > 0 {
		t.row(header...)
	}
	return t
}

func (t *table) row(cells ...string) {
	for i, c := range cells {
		if c == "" {
			cells[i] = "-"
		}
		// A tab or newline in a value (a label, a reason) would break the
		// columns.
		cells[i] = strings.NewReplacer("\t", " ", "\n", " ").Replace(cells[i])
	}
	fmt.Fprintln(t.tw, strings.Join(cells, "\t"))
}

func (t *table) flush() error { return t.tw.Flush() }

// str is *p, or "" for nil.
func str[T ~string](p *T) string {
	if p == nil {
		return ""
	}
	return string(*p)
}

// num formats n with thousands separators: capacities run to millions.
func num(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, r := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(r)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

// age is how long ago t was, in kubectl's style (5s, 3m, 2h, 4d).
func (a *app) age(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	d := a.now().Sub(t)
	switch {
	case d < 0:
		return "0s"
	case d < 2*time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < 2*time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d.Hours()))
	}
	return fmt.Sprintf("%dd", int(d.Hours()/24))
}

// timestampLayout is RFC 3339 in UTC with the database's microseconds when
// there are any: a time copied from a table into `who --at` or `history
// --from` then names the same instant, not the start of its second.
const timestampLayout = "2006-01-02T15:04:05.999999Z07:00"

// timestamp is an instant as the API takes it back.
func timestamp(t *time.Time) string {
	if t == nil || t.IsZero() {
		return ""
	}
	return t.UTC().Format(timestampLayout)
}

// labels prints a label map as k=v,k=v in key order.
func labels(m map[string]string) string {
	var parts []string
	for _, k := range sortedKeys(m) {
		parts = append(parts, k+"="+m[k])
	}
	return strings.Join(parts, ",")
}
