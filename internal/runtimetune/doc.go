// Package runtimetune tunes the Go runtime for a server whose live heap is
// small and whose load comes and goes: a GCTuner keeps the garbage
// collector from running every few megabytes while the live heap is below
// a floor (StartGC), and a ProcsTuner runs the process on one P while its
// goroutines seldom wait for one and on every P as soon as they do
// (StartProcs).
//
// Each tunes a setting that is the process's (the GC percent,
// GOMAXPROCS) and assumes nothing else sets it; each gives the runtime its
// default back when stopped, and a nil tuner stops without a fuss. Why
// ratelimitd needs them is in docs/design/gc-tuning.md and
// docs/design/adaptive-procs.md.
package runtimetune
