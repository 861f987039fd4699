// Package cputime reports the CPU time this process has used, so that
// benchmarks can report a figure that noisy neighbours on a shared
// machine do not inflate the way they inflate wall-clock time.
package cputime

import "time"

// Process returns the user + system CPU time of this process; 0 where the
// platform does not report it.
func Process() time.Duration { return process() }
