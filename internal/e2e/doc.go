// Package e2e holds end-to-end tests that use the service as a person would:
// the real HTTP wiring on a real PostgreSQL database, driven from a headless
// Chromium (Debian's chromium package) with chromedp. It has no code of its
// own; its tests run in make test like every other package's.
package e2e
