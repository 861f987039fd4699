package main

import (
	"flag"
	"fmt"
	"io"
	"strings"
)

// newFlagSet returns a flag set that reports errors instead of exiting.
func newFlagSet(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("ringlimit "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return fs
}

// parseFlags parses args, then fills every flag not given on the command
// line from the environment variable RINGLIMIT_<FLAG> (dashes become
// underscores, letters upper case): the command line wins.
func parseFlags(fs *flag.FlagSet, args []string, getenv func(string) string) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if set[f.Name] || err != nil {
			return
		}
		env := envName(f.Name)
		if v := getenv(env); v != "" {
			if e := fs.Set(f.Name, v); e != nil {
				err = fmt.Errorf("%s=%q: %w", env, v, e)
			}
		}
	})
	return err
}

// envExcept is getenv without the variables of the named flags: they
// are read from the command line only. A flag is kept out of the
// environment when the variable of the same name means something else
// where the command runs: RINGLIMIT_ID is, in a member's container or
// pod, the id of that member (serve --id), while leave --id names the
// member to remove.
func envExcept(getenv func(string) string, flags ...string) func(string) string {
	return func(name string) string {
		for _, f := range flags {
			if name == envName(f) {
				return ""
			}
		}
		return getenv(name)
	}
}

// envName is the environment variable of a flag: --data-dir → RINGLIMIT_DATA_DIR.
func envName(flagName string) string {
	return "RINGLIMIT_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// baseURL turns "host:port" or "http(s)://host:port[/]" into a URL
// without a trailing slash.
func baseURL(addr string) string {
	addr = strings.TrimRight(strings.TrimSpace(addr), "/")
	if strings.HasPrefix(addr, "http://") || strings.HasPrefix(addr, "https://") {
		return addr
	}
	return "http://" + addr
}

// hostPort turns "http://host:port" or "host:port" into "host:port".
func hostPort(addr string) string {
	addr = strings.TrimSpace(addr)
	for _, p := range []string{"http://", "https://"} {
		addr = strings.TrimPrefix(addr, p)
	}
	return strings.TrimRight(addr, "/")
}
