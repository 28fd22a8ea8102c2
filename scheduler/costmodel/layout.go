package costmodel

// layout is how the model's layers sit on a pipeline: p stages of v model
// chunks each. Chunk j of stage r is model segment j·p + r (Megatron-LM's
// interleaved assignment); segment 0 also holds the embedding and the last
// segment the output layer and loss.
type layout struct {
	p, v int
	// seg[k] is the number of transformer blocks of segment k.
	seg []int
	// uneven is set when the blocks do not split equally over the segments.
	uneven bool
}

// newLayout splits layers over p·v segments. When they divide, every
// segment gets the same number (Megatron-LM's default). Otherwise the
// embedding and the output layer each count as one layer (Megatron-Core's
// --account-for-embedding-in-pipeline-split and
// --account-for-loss-in-pipeline-split): layers+2 slots are spread as
// evenly as possible, the remainder going to the stages that carry least,
// and the first and last segments give one slot each to the embedding and
// output layer. Llama 3 405B's 126 layers on 16 stages become 7, 8 … 8, 7.
func newLayout(layers, p, v int) layout {
	k := p * v
	l := layout{p: p, v: v, seg: make([]int, k)}
	if layers%k == 0 {
		for i := range l.seg {
			l.seg[i] = layers / k
		}
		return l
	}
	l.uneven = true
	slots := layers + 2
	base, extra := slots/k, slots%k
	for i := range l.seg {
		l.seg[i] = base
	}
	// Give the extra slots one per stage, middle stages first (they carry
	// neither the embedding nor the output layer), then by chunk.
	if extra > 0 {
		order := stageOrder(p)
		given := 0
		for j := 0; given < extra; j++ {
			for _, r := range order {
				if given == extra {
					break
				}
				// Later chunks first on a stage: the first chunk of stage 0
				// and the last of stage p−1 already carry more.
				chunk := v - 1 - j%v
				if r == p-1 {
					chunk = j % v
				}
				l.seg[chunk*p+r]++
				given++
			}
		}
	}
	l.seg[0]--
	l.seg[k-1]--
	// A segment can only go below zero when slots < k, which normalize
	// rejects; keep the layout total right regardless.
	for i := range l.seg {
		if l.seg[i] < 0 {
			l.seg[i] = 0
		}
	}
	return l
}

// stageOrder lists stages middle-out: 1, 2, …, p−2, then p−1, then 0.
func stageOrder(p int) []int {
	out := make([]int, 0, p)
	for r := 1; r < p-1; r++ {
		out = append(out, r)
	}
	if p > 1 {
		out = append(out, p-1)
	}
	out = append(out, 0)
	return out
}

// stageLayers returns the blocks of each stage.
func (l layout) stageLayers() []int {
	out := make([]int, l.p)
	for k, n := range l.seg {
		out[k%l.p] += n
	}
	return out
}

// inFlight returns how many micro-batches of chunk j stage r holds
// activations for at its peak, under Megatron-LM's 1F1B schedules with m
// micro-batches: the plain one keeps min(m, p−r); the interleaved one runs
// 2(p−1−r) + (v−1)·p warm-up forward steps, in groups of p micro-batches
// per chunk, before its first backward.
func (l layout) inFlight(r, j, m int) int {
	if l.v == 1 {
		return min(m, l.p-r)
	}
	stored := min(m*l.v, 2*(l.p-1-r)+(l.v-1)*l.p+1)
	group := l.p * l.v
	q, rem := stored/group, stored%group
	return q*l.p + min(max(rem-j*l.p, 0), l.p)
}
