// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package deploy

import (
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// maxTableCell is the longest a markdown table cell of docs/ may be, in
// characters: a few lines of a flag's meaning or an error's cases. A longer
// one is a paragraph, which reads better as text or a list below the table.
// (The longest kept, flag and error cells, have 300 to 340.)
const maxTableCell = 350

// tableCell is one cell of a markdown table: its line, from 1, and text.
type tableCell struct {
	line int
	text string
}

var delimiterRow = regexp.MustCompile(`^\|[\s:|-]+\|$`)

// tableCells returns the cells of the markdown tables in src: rows are lines
// that start and end with |, outside fenced code blocks; a | that is escaped
// or inside a code span does not split cells.
func tableCells(src string) []tableCell {
	var cells []tableCell
	fenced := false
	for i, line := range strings.Split(src, "\n") {
		row := strings.TrimSpace(line)
		if strings.HasPrefix(row, "```") {
			fenced = !fenced
			continue
		}
		if fenced || len(row) < 2 || row[0] != '|' || row[len(row)-1] != '|' || delimiterRow.MatchString(row) {
			continue
		}
		var cur strings.Builder
		code := false
		body := row[1 : len(row)-1]
		for j := 0; j < len(body); j++ {
			switch c := body[j]; {
			case c == '\\' && j+1 < len(body):
				cur.WriteString(body[j : j+2])
				j++
			case c == '|' && !code:
				cells = append(cells, tableCell{i + 1, strings.TrimSpace(cur.String())})
				cur.Reset()
			default:
				if c == '`' {
					code = !code
				}
				cur.WriteByte(c)
			}
		}
		cells = append(cells, tableCell{i + 1, strings.TrimSpace(cur.String())})
	}
	return cells
}

// No table cell of docs/*.md holds a paragraph.
func TestDocsTableCellsAreShort(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(repoRoot(t), "docs", "*.md"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no docs/*.md: %v", err)
	}
	for _, f := range files {
		for _, c := range tableCells(readFile(t, f)) {
			if n := len([]rune(c.text)); n > maxTableCell {
				t.Errorf("docs/%s:%d: a table cell of %d characters (at most %d): put the paragraph below the table",
					filepath.Base(f), c.line, n, maxTableCell)
			}
		}
	}
}

func TestTableCells(t *testing.T) {
	src := "text | not a row\n| a | b |\n|---|:-:|\n| `x|y` | c \\| d |\n```\n| fenced | row |\n```\n"
	got := tableCells(src)
	want := []tableCell{{2, "a"}, {2, "b"}, {4, "`x|y`"}, {4, `c \| d`}}
	if len(got) != len(want) {
		t.Fatalf("tableCells = %v; want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("cell %d = %v; want %v", i, got[i], want[i])
		}
	}
}
