package omni

// ExtraText is the documents as they are added to the join config.
func ExtraText(d ExtraDocuments) string { return d.text }

// AppendExtra is d.appendTo(docs).
func AppendExtra(d ExtraDocuments, docs string) (string, error) { return d.appendTo(docs) }
