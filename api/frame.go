package api

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"google.golang.org/protobuf/proto"
)

// MaxFrameSize bounds one message on the wire, so a corrupt or hostile
// length prefix cannot make a reader allocate without limit.
const MaxFrameSize = 16 << 20

// ErrFrameTooLarge is returned for a frame whose length exceeds MaxFrameSize.
var ErrFrameTooLarge = errors.New("frame exceeds 16 MiB limit")

// WriteFrame writes m as a uvarint length followed by its protobuf bytes.
func WriteFrame(w io.Writer, m proto.Message) error {
	b, err := proto.Marshal(m)
	if err != nil {
		return fmt.Errorf("marshal %T: %w", m, err)
	}
	if len(b) > MaxFrameSize {
		return fmt.Errorf("write %T of %d bytes: %w", m, len(b), ErrFrameTooLarge)
	}
	buf := make([]byte, binary.MaxVarintLen64, binary.MaxVarintLen64+len(b))
	n := binary.PutUvarint(buf, uint64(len(b)))
	buf = append(buf[:n], b...)
	if _, err := w.Write(buf); err != nil {
		return fmt.Errorf("write %T: %w", m, err)
	}
	return nil
}

// FrameReader reads length-prefixed protobuf messages from a stream.
type FrameReader struct {
	r   *bufio.Reader
	buf []byte
}

// NewFrameReader wraps r.
func NewFrameReader(r io.Reader) *FrameReader {
	return &FrameReader{r: bufio.NewReader(r)}
}

// Skip reads past the next frame without decoding it, for a reader that
// sheds what it cannot keep up with; like Read it returns io.EOF at a
// clean end of stream.
func (fr *FrameReader) Skip() error {
	n, err := fr.length()
	if err != nil {
		return err
	}
	if _, err := fr.r.Discard(n); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return fmt.Errorf("skip frame body (%d bytes): %w", n, err)
	}
	return nil
}

// length reads the next frame's length prefix.
func (fr *FrameReader) length() (int, error) {
	n, err := binary.ReadUvarint(fr.r)
	if err != nil {
		if errors.Is(err, io.EOF) {
			return 0, io.EOF
		}
		return 0, fmt.Errorf("read frame length: %w", err)
	}
	if n > MaxFrameSize {
		return 0, fmt.Errorf("read frame of %d bytes: %w", n, ErrFrameTooLarge)
	}
	return int(n), nil
}

// Read decodes the next frame into m. It returns io.EOF at a clean end of
// stream and io.ErrUnexpectedEOF when the stream ends inside a frame.
func (fr *FrameReader) Read(m proto.Message) error {
	n, err := fr.length()
	if err != nil {
		return err
	}
	if cap(fr.buf) < n {
		fr.buf = make([]byte, n)
	}
	fr.buf = fr.buf[:n]
	if _, err := io.ReadFull(fr.r, fr.buf); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return fmt.Errorf("read frame body (%d bytes): %w", n, err)
	}
	if err := proto.Unmarshal(fr.buf, m); err != nil {
		return fmt.Errorf("decode %T: %w", m, err)
	}
	return nil
}
