package assets

// KindCheck is kindCheck, for tests.
func KindCheck(name string) func([]byte) error { return kindCheck(name) }
