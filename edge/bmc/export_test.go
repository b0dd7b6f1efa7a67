package bmc

// Clean is clean, for its fuzz target.
var Clean = clean
