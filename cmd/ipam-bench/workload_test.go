package main

import (
	"slices"
	"testing"
)

func TestNodesFor(t *testing.T) {
	tests := []struct {
		name    string
		i, c, n int
		want    []int
	}{
		{"32 workers split 64 nodes", 0, 32, 64, []int{0, 32}},
		{"last of 32 workers", 31, 32, 64, []int{31, 63}},
		{"3 workers, uneven split", 2, 3, 8, []int{2, 5}},
		{"as many workers as nodes", 5, 8, 8, []int{5}},
		{"more workers than nodes share", 9, 16, 8, []int{1}},
		{"one worker drives every node", 0, 1, 3, []int{0, 1, 2}},
	}
	for _, tt := range tests {
		if got := nodesFor(tt.i, tt.c, tt.n); !slices.Equal(got, tt.want) {
			t.Errorf("%s: nodesFor(%d, %d, %d) = %v; want %v", tt.name, tt.i, tt.c, tt.n, got, tt.want)
		}
	}
}
