package views

import (
	"sort"
	"strconv"
	"strings"
)

// HostList writes node names compactly as Slurm's hostlists do:
// node-00,node-01,node-02,node-07 becomes node-[00-02,07]. Names are
// grouped by what precedes their trailing digits (and by the digits'
// width, so zero padding survives); names without trailing digits stay as
// they are.
func HostList(names []string) string {
	type group struct {
		prefix string
		width  int
		nums   []int
	}
	var order []string
	groups := map[string]*group{}
	var plain []string
	for _, n := range names {
		i := len(n)
		for i > 0 && n[i-1] >= '0' && n[i-1] <= '9' {
			i--
		}
		digits := n[i:]
		v, err := strconv.Atoi(digits)
		if digits == "" || err != nil || len(digits) > 9 {
			plain = append(plain, n)
			continue
		}
		key := n[:i] + "\x00" + strconv.Itoa(len(digits))
		g := groups[key]
		if g == nil {
			g = &group{prefix: n[:i], width: len(digits)}
			groups[key] = g
			order = append(order, key)
		}
		g.nums = append(g.nums, v)
	}
	var parts []string
	for _, key := range order {
		g := groups[key]
		sort.Ints(g.nums)
		pad := func(v int) string {
			s := strconv.Itoa(v)
			return strings.Repeat("0", max(g.width-len(s), 0)) + s
		}
		var ranges []string
		for i := 0; i < len(g.nums); {
			j := i
			for j+1 < len(g.nums) && g.nums[j+1] <= g.nums[j]+1 {
				j++
			}
			if g.nums[i] == g.nums[j] {
				ranges = append(ranges, pad(g.nums[i]))
			} else {
				ranges = append(ranges, pad(g.nums[i])+"-"+pad(g.nums[j]))
			}
			i = j + 1
		}
		if len(ranges) == 1 && !strings.Contains(ranges[0], "-") {
			parts = append(parts, g.prefix+ranges[0])
			continue
		}
		parts = append(parts, g.prefix+"["+strings.Join(ranges, ",")+"]")
	}
	return strings.Join(append(parts, plain...), ",")
}
