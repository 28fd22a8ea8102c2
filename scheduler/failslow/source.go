package failslow

// Proc is one rank's process, as nodes report it.
type Proc struct {
	Node string
	PID  uint32
}

// Source decides which records time each collective. A call record's exit
// is the call's return, which on a GPU is the enqueue; where the NCCL
// profiler plugin reports completions, the completion's end is when the
// work was done, and the analysis takes those instead. Each collective is
// fed once: on a communicator, the calls are fed until its first
// completion arrives, and after that the completions of the collectives
// no call has fed (on a GPU the calls run ahead of their completions).
type Source struct {
	comms map[sourceKey]*sourceComm
}

type sourceKey struct {
	proc Proc
	comm uint64
}

type sourceComm struct {
	timed bool   // completions seen: they time the collectives
	fed   uint64 // the highest seq a call fed
}

// Use reports whether a record of p's communicator comm, collective seq,
// feeds the analysis; completion says whether it is a completion record.
func (s *Source) Use(p Proc, comm, seq uint64, completion bool) bool {
	if s.comms == nil {
		s.comms = map[sourceKey]*sourceComm{}
	}
	k := sourceKey{p, comm}
	c := s.comms[k]
	if c == nil {
		c = &sourceComm{}
		s.comms[k] = c
	}
	if !completion {
		if c.timed {
			return false
		}
		c.fed = max(c.fed, seq)
		return true
	}
	c.timed = true
	return seq > c.fed
}

// Keep forgets every process live does not keep (processes that exited),
// so memory follows the live ranks.
func (s *Source) Keep(live func(Proc) bool) {
	for k := range s.comms {
		if !live(k.proc) {
			delete(s.comms, k)
		}
	}
}

// Len is how many communicators of live processes s remembers.
func (s *Source) Len() int { return len(s.comms) }
