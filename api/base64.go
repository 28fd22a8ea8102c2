package api

import (
	"encoding/base64"
	"errors"
)

var rawURLStrict = base64.RawURLEncoding.Strict()

// errNotBase64URL is returned for a byte outside the alphabet.
var errNotBase64URL = errors.New("holds a byte outside unpadded base64url (A-Z a-z 0-9 - _)")

// DecodeBase64URL decodes unpadded base64url with exactly one spelling per
// value: Go's decoder skips \r and \n even in strict mode, so the alphabet
// is checked first and any other byte is refused.
func DecodeBase64URL(s string) ([]byte, error) {
	for _, c := range []byte(s) {
		if !(c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return nil, errNotBase64URL
		}
	}
	return rawURLStrict.DecodeString(s)
}
