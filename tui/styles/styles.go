// Package styles holds every colour and border of the console in one
// Styles value, built once per terminal (dark or light background, colour
// or not) and shared by all views.
package styles

import (
	"fmt"
	"image/color"

	"charm.land/bubbles/v2/help"
	"charm.land/lipgloss/v2"
	"github.com/charmbracelet/colorprofile"
	"github.com/charmbracelet/x/ansi"
)

// HeatLevels is how many steps the heat map's scale has.
const HeatLevels = 10

// Special heat cells beyond the scale.
const (
	// HeatFaulty is a GPU that is unhealthy (XID, ECC, lost).
	HeatFaulty = HeatLevels + iota
	// HeatStale is a GPU of a node that is down: its figures are old.
	HeatStale
	// HeatEmpty is a slot with no GPU.
	HeatEmpty
	heatCells
)

// Styles is the console's look. Build it with New; treat it as read-only.
type Styles struct {
	// Color is false on terminals without colour (NO_COLOR, dumb
	// terminals, golden tests): views then draw shapes instead of hues.
	Color bool
	Dark  bool

	App, Header, Title, Crumb, Role, Dim, Bold, Key, KeyDesc lipgloss.Style
	OK, Warn, Crit, Info                                     lipgloss.Style
	Banner, BannerCrit                                       lipgloss.Style
	TableHeader, Row, Selected, Marked, SelectedMarked       lipgloss.Style
	Dialog, DialogTitle, Button, ButtonFocus, Danger         lipgloss.Style
	Cmdline, Flash, FlashErr, Bar, BarEmpty, Spark           lipgloss.Style

	// Heat holds, for every pair of levels (top, bottom), the escape
	// sequence and half block that shows both in one cell; HeatMono is one
	// glyph per level for terminals without colour.
	Heat     [heatCells][heatCells]string
	HeatMono [heatCells]string
	// HeatLegend is one cell per scale level, lowest first.
	HeatLegend []string
	// Help is the status line's key help: bubbles' own look, in the
	// palette like every other colour here.
	Help help.Styles
}

// ColorOn reports whether profile p shows colours.
func ColorOn(p colorprofile.Profile) bool { return p > colorprofile.Ascii }

// New builds the styles for a terminal with profile p and a dark or light
// background.
func New(p colorprofile.Profile, dark bool) *Styles {
	ld := lipgloss.LightDark(dark)
	s := &Styles{Color: ColorOn(p), Dark: dark}
	fg := ld(lipgloss.Color("235"), lipgloss.Color("252"))
	dim := ld(lipgloss.Color("244"), lipgloss.Color("242"))
	accent := ld(lipgloss.Color("25"), lipgloss.Color("75"))
	green := ld(lipgloss.Color("28"), lipgloss.Color("78"))
	yellow := ld(lipgloss.Color("130"), lipgloss.Color("221"))
	red := ld(lipgloss.Color("160"), lipgloss.Color("203"))
	selBG := ld(lipgloss.Color("254"), lipgloss.Color("237"))
	markFG := ld(lipgloss.Color("90"), lipgloss.Color("213"))

	base := lipgloss.NewStyle()
	s.App = base.Foreground(fg)
	s.Header = base.Bold(true)
	s.Title = base.Bold(true).Foreground(accent)
	s.Crumb = base.Foreground(accent)
	s.Role = base.Foreground(dim)
	s.Dim = base.Foreground(dim)
	s.Bold = base.Bold(true)
	s.Key = base.Bold(true).Foreground(accent)
	s.KeyDesc = base.Foreground(dim)
	s.OK = base.Foreground(green)
	s.Warn = base.Foreground(yellow)
	s.Crit = base.Foreground(red).Bold(true)
	s.Info = base.Foreground(accent)
	s.Banner = base.Bold(true).Foreground(lipgloss.Color("0")).Background(yellow)
	s.BannerCrit = base.Bold(true).Foreground(lipgloss.Color("231")).Background(red)
	s.TableHeader = base.Bold(true).Foreground(dim)
	s.Row = base
	s.Marked = base.Foreground(markFG).Bold(true)
	if s.Color {
		s.Selected = base.Background(selBG).Bold(true)
		s.SelectedMarked = s.Selected.Foreground(markFG)
	} else {
		// Without colour a selection still has to show.
		s.Selected = base.Reverse(true)
		s.SelectedMarked = base.Reverse(true).Bold(true)
	}
	s.Dialog = base.Border(lipgloss.RoundedBorder()).BorderForeground(accent).Padding(0, 1)
	s.DialogTitle = base.Bold(true)
	s.Button = base.Padding(0, 1).Foreground(dim)
	s.ButtonFocus = base.Padding(0, 1).Reverse(true).Bold(true)
	s.Danger = base.Foreground(red).Bold(true)
	s.Cmdline = base.Foreground(fg)
	s.Flash = base.Foreground(green)
	s.FlashErr = base.Foreground(red)
	s.Bar = base.Foreground(accent)
	s.BarEmpty = base.Foreground(dim)
	s.Spark = base.Foreground(accent)
	s.buildHeat(dark)
	s.Help = paletteHelp()
	return s
}

// paletteHelp is bubbles' dark help look with each colour its nearest in
// the 256-colour palette, which is what a 256-colour terminal showed of it.
// Every colour of the console is a palette colour, so an SSH session's
// renderer can pass them through to such a terminal unconverted.
func paletteHelp() help.Styles {
	h := help.DefaultDarkStyles()
	for _, st := range []*lipgloss.Style{&h.Ellipsis, &h.ShortKey, &h.ShortDesc, &h.ShortSeparator, &h.FullKey, &h.FullDesc, &h.FullSeparator} {
		if fg := st.GetForeground(); fg != nil {
			*st = st.Foreground(ansi.Convert256(fg))
		}
	}
	return h
}

// heatPalette is a blue-to-red scale in the xterm 256-colour cube, readable
// on dark and light backgrounds alike.
var heatPalette = [HeatLevels]uint8{17, 19, 26, 32, 37, 71, 148, 214, 202, 196}

func (s *Styles) buildHeat(dark bool) {
	cell := func(i int) uint8 {
		switch i {
		case HeatFaulty:
			return 201
		case HeatStale:
			return 240
		case HeatEmpty:
			if dark {
				return 234
			}
			return 253
		}
		return heatPalette[i]
	}
	for t := range heatCells {
		for b := range heatCells {
			s.Heat[t][b] = fmt.Sprintf("\x1b[38;5;%d;48;5;%dm▀", cell(t), cell(b))
		}
	}
	mono := []string{"·", "·", "░", "░", "▒", "▒", "▓", "▓", "█", "█"}
	copy(s.HeatMono[:], mono)
	s.HeatMono[HeatFaulty] = "X"
	s.HeatMono[HeatStale] = "-"
	s.HeatMono[HeatEmpty] = " "
	for i := range HeatLevels {
		if s.Color {
			s.HeatLegend = append(s.HeatLegend, s.Heat[i][i]+Reset)
		} else {
			s.HeatLegend = append(s.HeatLegend, s.HeatMono[i])
		}
	}
}

// Reset ends any escape sequence a heat cell started.
const Reset = "\x1b[0m"

// Level maps a fraction in [0,1] onto the heat scale.
func Level(f float64) int {
	switch {
	case f != f || f <= 0:
		return 0
	case f >= 1:
		return HeatLevels - 1
	}
	return int(f * HeatLevels)
}

// Fg returns a style with foreground c, for the rare view that needs one
// more colour than the set above.
func Fg(c color.Color) lipgloss.Style { return lipgloss.NewStyle().Foreground(c) }
