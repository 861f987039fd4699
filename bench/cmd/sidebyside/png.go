package main

import (
	"os"

	"gonum.org/v1/plot/vg/vgimg"
)

func writePNG(img *vgimg.Canvas, path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
