package controlplane

// ring is a bounded FIFO that overwrites its oldest element when full. It
// keeps recent history (GPU samples, traced calls) without unbounded growth.
type ring[T any] struct {
	buf   []T
	start int
	n     int
}

func newRing[T any](capacity int) *ring[T] {
	return &ring[T]{buf: make([]T, capacity)}
}

// push appends v and reports whether an old element was overwritten.
func (r *ring[T]) push(v T) bool {
	if len(r.buf) == 0 {
		return true
	}
	if r.n < len(r.buf) {
		r.buf[(r.start+r.n)%len(r.buf)] = v
		r.n++
		return false
	}
	r.buf[r.start] = v
	r.start = (r.start + 1) % len(r.buf)
	return true
}

// len returns the number of elements held.
func (r *ring[T]) len() int { return r.n }

// at returns the i-th oldest element.
func (r *ring[T]) at(i int) T { return r.buf[(r.start+i)%len(r.buf)] }

// slice copies the elements out, oldest first.
func (r *ring[T]) slice() []T {
	out := make([]T, r.n)
	for i := range out {
		out[i] = r.at(i)
	}
	return out
}
