package nvml

import (
	"context"
	"fmt"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpuctl/gpuctl/api"
)

// eventWait is how long one NVML event-set wait blocks, so that a cancelled
// context is noticed within it.
const eventWait = 500 * time.Millisecond

// enqueue holds an event for the reader of Events. When nobody reads for
// long, the oldest are dropped and counted (DroppedEvents).
func (s *Sampler) enqueue(ev *api.Event) {
	s.qmu.Lock()
	if len(s.queue) >= maxQueuedEvents {
		n := len(s.queue) - maxQueuedEvents + 1
		s.queue = append(s.queue[:0], s.queue[n:]...)
		s.dropped += uint64(n)
		s.log.Warn("GPU event queue full; oldest events dropped", "dropped_total", s.dropped)
	}
	s.queue = append(s.queue, ev)
	s.qmu.Unlock()
	select {
	case s.notify <- struct{}{}:
	default:
	}
}

// DroppedEvents counts events dropped because nobody read Events for long.
func (s *Sampler) DroppedEvents() uint64 {
	s.qmu.Lock()
	defer s.qmu.Unlock()
	return s.dropped
}

// Events streams GPU events until ctx ends, then closes the channel:
//   - EVENT_KIND_XID for every Xid NVML's event set reports, one event per
//     occurrence, with the code, its catalog class (ClassifyXID), severity
//     and Count = occurrences of that Xid on that GPU since the sampler
//     started;
//   - EVENT_KIND_ECC when ECC error counts rise (from NVML's ECC events or
//     from samples, whichever sees the rise first);
//   - EVENT_KIND_THROTTLE when a hardware or thermal throttle reason appears
//     (attrs state=began, reasons=…) and when all have cleared (state=ended);
//   - EVENT_KIND_GPU_LOST when a GPU stops answering, and again (severity
//     info, attrs state=recovered) when it answers again.
//
// Transitions are found by Sample, so they flow only while something calls
// it. Events carry no node or sequence number; the agent assigns those.
// The GPUs are registered with NVML before Events returns, so every Xid
// raised after it is reported. Calling Events again returns the same
// channel.
func (s *Sampler) Events(ctx context.Context) <-chan *api.Event {
	s.eventsOnce.Do(func() {
		s.events = make(chan *api.Event, 64)
		set := s.registerNVMLEvents()
		go s.runEvents(ctx, set)
	})
	return s.events
}

func (s *Sampler) runEvents(ctx context.Context, set nvml.EventSet) {
	defer close(s.events)
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		if set != nil {
			defer set.Free()
			s.watchNVML(ctx, set)
		}
	}()
	defer func() { <-watched }()
	for {
		s.qmu.Lock()
		batch := s.queue
		s.queue = nil
		s.qmu.Unlock()
		for _, ev := range batch {
			select {
			case s.events <- ev:
			case <-ctx.Done():
				return
			}
		}
		select {
		case <-s.notify:
		case <-ctx.Done():
			return
		}
	}
}

// registerNVMLEvents creates an NVML event set with every GPU registered
// for the watched event types; nil when NVML offers none.
func (s *Sampler) registerNVMLEvents() nvml.EventSet {
	set, ret := s.lib.EventSetCreate()
	if ret != nvml.SUCCESS {
		s.log.Warn("NVML event set unavailable; Xids will not be reported", "err", ret)
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.initLocked(); err != nil {
		s.log.Warn("NVML events not watched", "err", err)
		set.Free()
		return nil
	}
	registered := 0
	for _, d := range s.devs {
		if d.handle == nil {
			continue
		}
		mask := uint64(wantedEvents)
		if sup, ret := d.handle.GetSupportedEventTypes(); ret == nvml.SUCCESS {
			mask &= sup
		}
		if mask == 0 {
			s.log.Warn("GPU reports none of the watched event types", "gpu", d.index)
			continue
		}
		if ret := d.handle.RegisterEvents(mask, set); ret != nvml.SUCCESS {
			s.log.Warn("GPU events not registered; its Xids will not be reported", "gpu", d.index, "err", ret)
			continue
		}
		registered++
	}
	if registered == 0 {
		s.log.Warn("no GPU registered for NVML events; Xids will not be reported")
		set.Free()
		return nil
	}
	return set
}

// watchNVML turns what the event set reports into events until ctx ends.
func (s *Sampler) watchNVML(ctx context.Context, set nvml.EventSet) {
	failures := 0
	for ctx.Err() == nil {
		data, ret := set.Wait(uint32(eventWait / time.Millisecond))
		switch {
		case ret == nvml.SUCCESS:
			failures = 0
			s.handleNVMLEvent(data)
		case ret == nvml.ERROR_TIMEOUT, isLost(ret):
			// Lost GPUs are reported by Sample.
			failures = 0
		default:
			failures++
			if failures >= 10 {
				s.log.Error("NVML event wait keeps failing; Xids are no longer reported", "err", ret)
				return
			}
			s.log.Warn("NVML event wait failed", "err", ret)
			select {
			case <-time.After(time.Second):
			case <-ctx.Done():
			}
		}
	}
}

// handleNVMLEvent turns one NVML event into sampler events.
func (s *Sampler) handleNVMLEvent(data nvml.EventData) {
	s.mu.Lock()
	defer s.mu.Unlock()
	d := s.deviceFor(data.Device)
	ts := s.now().UnixNano()
	if data.EventType&nvml.EventTypeXidCriticalError != 0 {
		code := uint32(data.EventData)
		s.xids[xidKey{d.index, code}]++
		class := ClassifyXID(code)
		ev := gpuEvent(d, ts, api.EventKind_EVENT_KIND_XID, severityOf(class), class,
			fmt.Sprintf("GPU %d: %s", d.index, DescribeXID(code)))
		ev.Xid, ev.Count = code, s.xids[xidKey{d.index, code}]
		s.enqueue(ev)
	}
	if data.EventType&(nvml.EventTypeDoubleBitEccError|nvml.EventTypeSingleBitEccError) != 0 && d.handle != nil {
		unc, r1 := d.handle.GetTotalEccErrors(nvml.MEMORY_ERROR_TYPE_UNCORRECTED, nvml.VOLATILE_ECC)
		corr, r2 := d.handle.GetTotalEccErrors(nvml.MEMORY_ERROR_TYPE_CORRECTED, nvml.VOLATILE_ECC)
		if r1 == nvml.SUCCESS && r2 == nvml.SUCCESS {
			// The driver counts the error before it signals it; a rise a
			// sample has already reported is not reported twice.
			s.eccRiseLocked(d, unc, corr, ts, "nvml_event")
			return
		}
		// The counters are unreadable: report the event itself rather than
		// lose it.
		dbe := data.EventType&nvml.EventTypeDoubleBitEccError != 0
		sev, class, what := api.Severity_SEVERITY_INFO, api.XIDClass_XID_CLASS_NONE, "corrected"
		if dbe {
			sev, class, what = api.Severity_SEVERITY_CRITICAL, api.XIDClass_XID_CLASS_RESET_GPU, "uncorrectable"
		}
		ev := gpuEvent(d, ts, api.EventKind_EVENT_KIND_ECC, sev, class, fmt.Sprintf("GPU %d: %s ECC error reported by the driver", d.index, what))
		ev.Count = 1
		ev.Attrs = map[string]string{"source": "nvml_event", "type": what}
		s.enqueue(ev)
	}
}

// deviceFor finds the GPU an NVML event is about; an unknown handle gives a
// placeholder with index -1 so the event is still reported.
func (s *Sampler) deviceFor(h nvml.Device) *devState {
	for _, d := range s.devs {
		if d.handle != nil && d.handle == h {
			return d
		}
	}
	if h != nil {
		if id, ret := h.GetUUID(); ret == nvml.SUCCESS {
			for _, d := range s.devs {
				if d.uuid == id {
					return d
				}
			}
		}
	}
	return &devState{index: -1}
}
