package lifecycle

import "os"

// UserID is the uid a server declared with user = name runs as on the host: that user's,
// or the agent's own when name is empty. Adoption compares it with a candidate process's
// real and effective uid, since the user is part of a server's identity.
func UserID(name string) (uint32, error) {
	if name == "" {
		return uint32(os.Geteuid()), nil
	}
	c, _, err := credential(name)
	if err != nil {
		return 0, err
	}
	return c.Uid, nil
}
