package rules

// Document is one rules document that does not come from a file: a
// domain's text as a rules database or an admin API holds it. Name stands
// for the file in errors and in Rule.File.
type Document struct {
	Name string
	Data []byte
}

// ParseDocuments reads several rules documents into one Set, as Load reads
// the files of a directory: each document is refused above ld's cap on a
// file, their total above its cap on a directory, and mistakes are returned
// all at once as Errors placed at name:line. The Set's Version is a digest
// of the documents' names and bytes, in the order given.
func (ld Loader) ParseDocuments(docs ...Document) (*Set, error) {
	srcs := make([]source, len(docs))
	var total int64
	for i, d := range docs {
		if int64(len(d.Data)) > ld.maxFile() {
			return nil, Errors{ld.tooLarge(d.Name, int64(len(d.Data)))}
		}
		if total += int64(len(d.Data)); total > ld.maxTotal() {
			return nil, Errors{{File: d.Name, Msg: "too large: the documents add up to more than the cap of " + byteSize(ld.maxTotal())}}
		}
		srcs[i] = source{d.Name, d.Data}
	}
	if len(srcs) == 0 {
		return &Set{domains: map[string]*domain{}}, nil
	}
	return ld.build(srcs)
}
