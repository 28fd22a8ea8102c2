package app

// ClickMsg is a mouse click at (X, Y) inside the active view's area.
type ClickMsg struct {
	X, Y int
}

// WheelMsg is the mouse wheel over the active view: Delta rows down
// (negative: up).
type WheelMsg struct {
	Delta int
}
