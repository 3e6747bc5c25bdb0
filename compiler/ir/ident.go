package ir

// IsCIdentifier reports whether s has the shape of a C identifier: a
// letter or underscore, then letters, digits and underscores, ASCII only.
// Every name that a code generator prints as code (a call_extern's
// function, an exported symbol) must pass it; keywords and reserved names
// are each generator's own to refuse.
func IsCIdentifier(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (i > 0 && c >= '0' && c <= '9')) {
			return false
		}
	}
	return true
}
