// Package fidelity holds the contract scenario the controller's Omni side is judged by: one sequence of user
// actions and machine events, run against a real Omni v1.9.3 and against the project's Omni stand-in, with
// everything the controller reads from Omni and writes to it recorded as a transcript at each step. The two
// transcripts must agree; the few steps only one of them can take (a real Omni collects machine information and
// counts install events only from a real Talos) are named with their reason.
//
// It is test tooling: nothing in the product imports it.
package fidelity
