package views

// LastLines returns the last n lines of data (a final line without a line
// break counts), and whether data held more than those.
func LastLines(data []byte, n int) ([]byte, bool) {
	end := len(data)
	if end > 0 && data[end-1] == '\n' {
		end--
	}
	for i := end - 1; i >= 0; i-- {
		if data[i] == '\n' {
			n--
			if n == 0 {
				return data[i+1:], true
			}
		}
	}
	return data, false
}
