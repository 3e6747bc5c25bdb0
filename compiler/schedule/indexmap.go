package schedule

// IndexMap maps the indices of a buffer to those of its new layout.
type IndexMap struct{}

func (p *pyParser) indexMap() (*IndexMap, error) {
	return nil, p.errorf("index maps are not supported")
}
