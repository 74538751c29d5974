package fetch

import (
	"os"
	"path/filepath"
)

// SimulateReboot makes the live record of name in dest look as if written in another boot
// of the machine, as after a reboot: the next Fetch must ignore it and trust only the
// sidecar's durable checkpoints.
func SimulateReboot(dest, name string) error {
	f, err := os.OpenFile(filepath.Join(dest, layoutOf(name).live), os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = f.WriteAt([]byte("00000000-0000-0000-0000-000000000000\x00\x00\x00\x00"), 24)
	return err
}
