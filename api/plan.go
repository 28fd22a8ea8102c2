package api

// GPUs is the number of GPUs the plan runs on: tp × cp × pp × dp.
func (p *JobPlan) GPUs() int32 {
	return p.GetTp() * max(p.GetCp(), 1) * p.GetPp() * p.GetDp()
}
