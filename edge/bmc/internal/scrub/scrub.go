// Package scrub removes credentials from text that another library wrote (an error from go-ipmi or gofish, a
// response body a BMC echoed). It replaces whole words only: a secret is never cut out of a longer word, so with
// the password "x" the word "expected" stays as it is and the pattern of replacements does not spell the password.
// Text the edge writes itself never holds a credential and is not scrubbed.
package scrub

import (
	"encoding/json"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Mark replaces a credential.
const Mark = "[redacted]"

// Text returns s with every whole-word occurrence of each non-empty secret replaced by Mark. An occurrence is whole
// when the characters next to it on both sides are not word characters (letters, digits, '_') or are the ends of s.
// A secret is also looked for in its JSON-escaped form, the way a BMC would echo it in a response body.
func Text(s string, secrets ...string) string {
	forms := make([]string, 0, 2*len(secrets))

	for _, secret := range secrets {
		if secret == "" {
			continue
		}

		forms = append(forms, secret)

		if esc := jsonEscaped(secret); esc != secret {
			forms = append(forms, esc)
		}
	}

	// Longer first: a user name inside a password must not split the password.
	slices.SortFunc(forms, func(a, b string) int { return len(b) - len(a) })

	for _, f := range forms {
		s = replaceWords(s, f)
	}

	return s
}

// Error is an error whose text has been scrubbed. Its Unwrap returns only Kind (a sentinel for errors.Is), never the
// original error: the original's text is what held the secret.
type Error struct {
	// Msg is the scrubbed text.
	Msg string
	// Kind is a sentinel the error matches with errors.Is (nil: none).
	Kind error
}

// NewError returns err's text, scrubbed of secrets, as an *Error of kind (nil: none).
func NewError(err error, kind error, secrets ...string) *Error {
	return &Error{Msg: Text(err.Error(), secrets...), Kind: kind}
}

// Error implements error.
func (e *Error) Error() string {
	if e.Kind != nil {
		return e.Kind.Error() + ": " + e.Msg
	}

	return e.Msg
}

// Unwrap returns Kind.
func (e *Error) Unwrap() error { return e.Kind }

func replaceWords(s, word string) string {
	var b strings.Builder

	done := 0 // s[:done] is in b (or needs no change)

	for from := 0; from <= len(s)-len(word); {
		i := strings.Index(s[from:], word)
		if i < 0 {
			break
		}

		i += from
		end := i + len(word)

		if !wordBefore(s[:i]) && !wordAfter(s[end:]) {
			b.WriteString(s[done:i])
			b.WriteString(Mark)
			done, from = end, end

			continue
		}

		// Part of a longer word: look again one character further on.
		_, size := utf8.DecodeRuneInString(s[i:])
		from = i + size
	}

	if done == 0 {
		return s
	}

	b.WriteString(s[done:])

	return b.String()
}

// wordBefore reports whether before ends with a word character.
func wordBefore(before string) bool {
	r, size := utf8.DecodeLastRuneInString(before)

	return size > 0 && isWord(r)
}

// wordAfter reports whether after starts with a word character.
func wordAfter(after string) bool {
	r, size := utf8.DecodeRuneInString(after)

	return size > 0 && isWord(r)
}

func isWord(r rune) bool {
	return r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r)
}

func jsonEscaped(s string) string {
	b, err := json.Marshal(s)
	if err != nil || len(b) < 2 {
		return s
	}

	return string(b[1 : len(b)-1])
}
