package tui

import (
	"context"
	"fmt"

	tea "charm.land/bubbletea/v2"

	"github.com/gpuctl/gpuctl/client"
	"github.com/gpuctl/gpuctl/tui/feed"
)

// Run opens the console on this terminal, following the cluster cl
// serves, until the operator quits or ctx ends.
func Run(ctx context.Context, cl *client.Client, o Options) error {
	o.Client = cl
	hub := feed.New(cl, feed.Options{Log: o.Log})
	p := tea.NewProgram(New(o), tea.WithContext(ctx))
	unsub := hub.Subscribe(p.Send)
	defer unsub()
	hctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		if err := hub.Run(hctx); err != nil && o.Log != nil {
			o.Log.Error("console watch ended", "err", err)
		}
	}()
	final, err := p.Run()
	if err != nil && ctx.Err() == nil {
		return fmt.Errorf("console: %w", err)
	}
	if m, ok := final.(*Model); ok && m.SwitchTo() != "" {
		return SwitchContext{Name: m.SwitchTo()}
	}
	return nil
}

// SwitchContext is Run's answer when the operator chose another of the
// client config's clusters with :ctx: the caller dials that one and runs
// the console again.
type SwitchContext struct{ Name string }

func (s SwitchContext) Error() string { return fmt.Sprintf("switch to context %q", s.Name) }
