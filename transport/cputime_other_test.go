//go:build !unix

package transport

import "time"

func processCPU() time.Duration { return 0 }
