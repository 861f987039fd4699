package transport

import (
	"bytes"
	"errors"
	"io"
	"testing"
)

// scripted is a connection whose peer sends fixed bytes and reads all.
type scripted struct {
	in  *bytes.Reader
	out bytes.Buffer
}

func (s *scripted) Read(p []byte) (int, error)  { return s.in.Read(p) }
func (s *scripted) Write(p []byte) (int, error) { return s.out.Write(p) }

// FuzzSecretHandshake feeds arbitrary bytes to both sides of the secret
// handshake: neither panics, neither reads more than the handshake's
// fixed size, and neither authenticates bytes chosen without the secret
// (the other side's nonce is fresh, so no input can carry a valid proof).
func FuzzSecretHandshake(f *testing.F) {
	f.Add([]byte(handshakeMagic + string(make([]byte, nonceSize))))
	f.Add([]byte(handshakeMagic + string(make([]byte, nonceSize)) + "\x00\x07n1:8082" + string(make([]byte, macSize))))
	f.Add([]byte("RLAUTH\x01\x00" + string(make([]byte, nonceSize+macSize+1))))
	f.Add([]byte(handshakeMagic + string(make([]byte, nonceSize+macSize+1))))
	f.Add(AppendBatchRequest(nil, 1, 0, batchOf(1, "r")))
	f.Add([]byte{0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0})
	f.Add([]byte{})
	secret := testSecret('k')
	f.Fuzz(func(t *testing.T, in []byte) {
		for _, side := range []struct {
			name string
			run  func(io.ReadWriter, []byte) error
			max  int
		}{
			{"acceptor", func(rw io.ReadWriter, s []byte) error { return secretAcceptor(rw, s, []string{"n1:8082"}) },
				len(handshakeMagic) + nonceSize + 2 + maxAddrLen + macSize},
			{"dialer", func(rw io.ReadWriter, s []byte) error { return secretDialer(rw, s, "n1:8082") },
				len(handshakeMagic) + nonceSize + macSize + 1},
		} {
			c := &scripted{in: bytes.NewReader(in)}
			err := side.run(c, secret)
			if err == nil {
				t.Fatalf("%s authenticated %x", side.name, in)
			}
			if read := len(in) - c.in.Len(); read > side.max {
				t.Fatalf("%s read %d bytes, more than the handshake's %d", side.name, read, side.max)
			}
			if !errors.Is(err, ErrAuth) && !errors.Is(err, io.EOF) {
				t.Fatalf("%s: %v does not wrap ErrAuth", side.name, err)
			}
		}
	})
}

// FuzzReadFrame: ReadFrame returns a prefix of its input that
// ParseHeader's length agrees with, or an error; it never allocates more
// than about growStep ahead of the bytes it has read.
func FuzzReadFrame(f *testing.F) {
	f.Add(AppendBatchRequest(nil, 1, 0, batchOf(3, "r")))
	f.Add([]byte{0xfc, 0xff, 0xff, 0x00, 1, 1})
	f.Add([]byte{10, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, in []byte) {
		frame, err := Limits{MaxFrameSize: 32 << 20}.ReadFrame(bytes.NewReader(in), nil)
		if cap(frame) > len(in)+2*growStep { // slices.Grow rounds up to a size class
			t.Fatalf("buffer of %d bytes for %d bytes of input", cap(frame), len(in))
		}
		if err != nil {
			return
		}
		if !bytes.Equal(frame, in[:len(frame)]) {
			t.Fatal("the frame is not a prefix of the input")
		}
	})
}
