package carbon

// Window is when and where a run's mean carbon intensity is lowest.
type Window struct {
	// Start is when the run starts; Site indexes the curves given.
	Start int64
	Site  int
	// Mean is the mean gCO2e/kWh over the run.
	Mean float64
}

// Decision is what Decide chose for a deferrable job.
type Decision struct {
	// Hold is true when the job should wait until Best.Start.
	Hold bool
	// Now is the cleanest site for a run starting now; Best the cleanest
	// start and site before the deadline (Now when nothing is cleaner).
	Now, Best Window
}

// Decide says whether a deferrable job should wait for a cleaner window.
// sites are the curves of the places it could run; duration is its
// predicted runtime (seconds) and deadline when it must have finished.
// Candidate starts are now and every hour boundary from which the run
// still ends by the deadline (at most one day of them: curves repeat
// daily). The job waits only when the best window's mean intensity is
// lower than the best site's now by more than minSaving (a fraction): a
// job with no curve, no estimate or no slack runs now.
func Decide(sites []*Curve, now, deadline, duration int64, minSaving float64) Decision {
	var d Decision
	if len(sites) == 0 || duration <= 0 {
		return d
	}
	d.Now = best(sites, now, duration)
	d.Best = d.Now
	latest := deadline - duration
	next := floorDiv(now, hour)*hour + hour
	for t := next; t <= latest && t < now+day; t += hour {
		if w := best(sites, t, duration); w.Mean < d.Best.Mean {
			d.Best = w
		}
	}
	d.Hold = d.Best.Start > now && d.Best.Mean < d.Now.Mean*(1-minSaving)
	if !d.Hold {
		d.Best = d.Now
	}
	return d
}

// best is the cleanest site for a run over [start, start+duration); ties go
// to the first site.
func best(sites []*Curve, start, duration int64) Window {
	w := Window{Start: start, Site: -1}
	for i, c := range sites {
		if m := c.Mean(start, start+duration); w.Site < 0 || m < w.Mean {
			w.Site, w.Mean = i, m
		}
	}
	return w
}
