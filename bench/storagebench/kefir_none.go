//go:build nokefir

package main

// Built with -tags nokefir (for when internal/storage does not build), the report shows
// Kefir's column as missing rather than failing to compile the comparison engines.
