// Package hostile holds the end-to-end hostile-input tests of issue 9 (point 2) that need
// the built agent: shell metacharacters in a server's flags and environment, and symlinks
// at and inside a download's dest and a server's log_dir. See docs/security.md.
package hostile
