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
	if _, err := p.Run(); err != nil && ctx.Err() == nil {
		return fmt.Errorf("console: %w", err)
	}
	return nil
}
