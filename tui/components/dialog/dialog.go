// Package dialog is the console's confirmation: a title, the blast radius
// of the action, optional text fields (a reason, nodes to exclude), and
// Cancel / Confirm buttons with the focus on Cancel. It ignores keys for a
// moment after it opens, so keys already in flight over a slow link
// cannot answer it.
package dialog

import (
	"strconv"
	"strings"
	"time"

	tea "charm.land/bubbletea/v2"
	"charm.land/lipgloss/v2"

	"github.com/gpuctl/gpuctl/tui/app"
	"github.com/gpuctl/gpuctl/tui/styles"
)

// Grace is how long a new dialog ignores keys.
const Grace = 300 * time.Millisecond

// Field is a text field of a dialog.
type Field struct {
	Label, Value string
}

// Confirm is a confirmation dialog; it implements app.Overlay.
type Confirm struct {
	Title, Body string
	Danger      bool
	Fields      []Field
	// OnConfirm makes the command to run from the fields' values.
	OnConfirm func(fields []Field) tea.Cmd

	st       *styles.Styles
	now      func() time.Time
	opened   time.Time
	focus    int // 0 Cancel, 1 Confirm
	field    int
	done     bool
	accepted bool
}

// New opens a dialog at now.
func New(st *styles.Styles, now func() time.Time, title, body string, danger bool, fields []Field, onConfirm func([]Field) tea.Cmd) *Confirm {
	return &Confirm{Title: title, Body: body, Danger: danger, Fields: fields, OnConfirm: onConfirm,
		st: st, now: now, opened: now()}
}

// Done reports whether the dialog was answered.
func (d *Confirm) Done() bool { return d.done }

// Accepted reports whether it was confirmed.
func (d *Confirm) Accepted() bool { return d.accepted }

// Focus is the focused button: "cancel" or "confirm".
func (d *Confirm) Focus() string {
	if d.focus == 1 {
		return "confirm"
	}
	return "cancel"
}

// Update handles a key.
func (d *Confirm) Update(msg tea.Msg) (app.Overlay, tea.Cmd) {
	k, ok := msg.(tea.KeyPressMsg)
	if !ok || d.done {
		return d, nil
	}
	if d.now().Sub(d.opened) < Grace {
		return d, nil
	}
	switch s := k.String(); s {
	case "esc", "ctrl+c":
		d.done = true
	case "tab", "right", "left", "shift+tab":
		d.focus = 1 - d.focus
	case "up":
		if len(d.Fields) > 0 {
			d.field = (d.field - 1 + len(d.Fields)) % len(d.Fields)
		}
	case "down":
		if len(d.Fields) > 0 {
			d.field = (d.field + 1) % len(d.Fields)
		}
	case "enter":
		d.done = true
		if d.focus == 1 {
			d.accepted = true
			if d.OnConfirm != nil {
				return d, d.OnConfirm(d.Fields)
			}
		}
	case "backspace":
		if len(d.Fields) > 0 {
			v := []rune(d.Fields[d.field].Value)
			if len(v) > 0 {
				d.Fields[d.field].Value = string(v[:len(v)-1])
			}
		}
	default:
		if len(d.Fields) > 0 && k.Text != "" {
			d.Fields[d.field].Value += k.Text
		}
	}
	return d, nil
}

// Render draws the dialog at most width × height.
func (d *Confirm) Render(width, height int) string {
	w := min(max(width-8, 20), 90)
	var b strings.Builder
	title := d.st.DialogTitle.Render(d.Title)
	if d.Danger {
		title = d.st.Danger.Render(d.Title)
	}
	b.WriteString(title + "\n\n")
	body := lipgloss.NewStyle().Width(w).Render(d.Body)
	lines := strings.Split(body, "\n")
	if room := height - 8 - len(d.Fields); len(lines) > room && room > 0 {
		more := len(lines) - room + 1
		lines = append(lines[:room-1], d.st.Dim.Render("… "+strconv.Itoa(more)+" more lines"))
	}
	b.WriteString(strings.Join(lines, "\n"))
	for i, f := range d.Fields {
		mark := "  "
		if i == d.field {
			mark = "› "
		}
		b.WriteString("\n" + mark + f.Label + ": " + d.st.Bold.Render(f.Value+"_"))
	}
	cancel, confirm := d.st.Button.Render("Cancel"), d.st.Button.Render("Confirm")
	if d.focus == 0 {
		cancel = d.st.ButtonFocus.Render("Cancel")
	} else {
		confirm = d.st.ButtonFocus.Render("Confirm")
	}
	b.WriteString("\n\n" + cancel + "  " + confirm)
	hint := "tab switch · enter choose · esc cancel"
	if len(d.Fields) > 0 {
		hint = "type to edit · ↑/↓ field · " + hint
	}
	b.WriteString("\n" + d.st.Dim.Render(hint))
	return d.st.Dialog.Render(b.String())
}
