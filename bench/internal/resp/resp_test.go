package resp

import (
	"bufio"
	"strings"
	"testing"
)

func TestReply(t *testing.T) {
	for _, tc := range []struct {
		in      string
		n       int64
		s       string
		wantErr string
	}{
		{in: ":1\r\n", n: 1},
		{in: ":-3\r\n", n: -3},
		{in: "+PONG\r\n", s: "PONG"},
		{in: "$5\r\nhe\r\no\r\n", s: "he\r\no"},
		{in: "$0\r\n\r\n", s: ""},
		{in: "-NOSCRIPT No matching script\r\n", wantErr: "redis: NOSCRIPT No matching script"},
		{in: "*1\r\n", wantErr: "unexpected reply"},
		{in: "+\n", wantErr: "short reply"},
		{in: "$9\r\nshort\r\n", wantErr: "EOF"},
	} {
		rc := &Conn{r: bufio.NewReader(strings.NewReader(tc.in))}
		n, s, err := rc.Reply()
		switch {
		case tc.wantErr != "":
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("Reply(%q) error %v, want one containing %q", tc.in, err, tc.wantErr)
			}
		case err != nil || n != tc.n || s != tc.s:
			t.Errorf("Reply(%q) = %d, %q, %v; want %d, %q", tc.in, n, s, err, tc.n, tc.s)
		}
	}
}

func TestAppendCmd(t *testing.T) {
	var rc Conn
	rc.AppendCmd("EVALSHA", "ab", "1", "")
	rc.AppendCmd("PING")
	want := "*4\r\n$7\r\nEVALSHA\r\n$2\r\nab\r\n$1\r\n1\r\n$0\r\n\r\n*1\r\n$4\r\nPING\r\n"
	if got := string(rc.w); got != want {
		t.Errorf("commands %q, want %q", got, want)
	}
}
