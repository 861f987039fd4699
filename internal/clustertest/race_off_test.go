//go:build !race

package clustertest

const raceDetector = false
