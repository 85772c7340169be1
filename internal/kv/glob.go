package kv

// Match reports whether s matches the glob pattern with Redis's semantics
// (stringmatchlen in Redis's util.c): '*' any run of bytes, '?' one byte,
// "[...]" a class ("[^...]" negated, "a-z" ranges in either order, "\x"
// escapes x inside and outside a class), '\' escaping the next byte. It is
// byte-wise and case-sensitive. SCAN's MATCH and KEYS share it, so both
// answer the same keys for one pattern.
//
// Like Redis's, a pattern of many stars cannot make it exponential: once a
// star has failed to match the rest at every position, no earlier star can
// do better (Redis's skipLongerMatches), so the search stops.
func Match(pattern, s []byte) bool {
	skip := false
	return match(pattern, s, 0, &skip)
}

// maxGlobNesting bounds the recursion on stars, as Redis does (its limit is
// 1000): a pattern of thousands of stars would otherwise exhaust the stack.
const maxGlobNesting = 1000

func match(pat, str []byte, nesting int, skipLonger *bool) bool {
	if nesting > maxGlobNesting {
		return false
	}
	// Indices rather than subslices, to follow Redis's pointer walk step for
	// step (its quirks included: an unterminated class ends at the
	// pattern's end). at reads 0 past the end, as C reads the terminator.
	at := func(i int) byte {
		if i < len(pat) {
			return pat[i]
		}
		return 0
	}
	p, s := 0, 0
	for p < len(pat) && s < len(str) {
		switch pat[p] {
		case '*':
			for p < len(pat) && at(p+1) == '*' {
				p++
			}
			if len(pat)-p == 1 {
				return true // a trailing star matches the rest
			}
			for s < len(str) {
				if match(pat[p+1:], str[s:], nesting+1, skipLonger) {
					return true
				}
				if *skipLonger {
					return false
				}
				s++
			}
			// The rest did not match anywhere after this star: an earlier
			// star cannot make it match either.
			*skipLonger = true
			return false
		case '?':
			s++
		case '[':
			p++
			not := at(p) == '^'
			if not {
				p++
			}
			hit := false
			for {
				if at(p) == '\\' && len(pat)-p >= 2 {
					p++
					if pat[p] == str[s] {
						hit = true
					}
				} else if at(p) == ']' {
					break
				} else if p >= len(pat) {
					p-- // the loop's step below lands on the end
					break
				} else if len(pat)-p >= 3 && pat[p+1] == '-' {
					lo, hi := pat[p], pat[p+2]
					if lo > hi {
						lo, hi = hi, lo
					}
					p += 2
					if lo <= str[s] && str[s] <= hi {
						hit = true
					}
				} else if pat[p] == str[s] {
					hit = true
				}
				p++
			}
			if not {
				hit = !hit
			}
			if !hit {
				return false
			}
			s++
		case '\\':
			if len(pat)-p >= 2 {
				p++
			}
			if pat[p] != str[s] {
				return false
			}
			s++
		default:
			if pat[p] != str[s] {
				return false
			}
			s++
		}
		p++
		if s == len(str) {
			for at(p) == '*' {
				p++
			}
			break
		}
	}
	return p >= len(pat) && s == len(str)
}

// LiteralPrefix returns the bytes every key matching pattern starts with (up
// to its first wildcard, escapes resolved), so a scan can start there and
// stop after the keys with that prefix instead of reading the keyspace.
func LiteralPrefix(pattern []byte) []byte {
	var out []byte
	for i := 0; i < len(pattern); i++ {
		switch c := pattern[i]; c {
		case '*', '?', '[':
			return out
		case '\\':
			if i+1 < len(pattern) {
				i++
				out = append(out, pattern[i])
				continue
			}
			// A trailing backslash matches itself (match's default case).
			out = append(out, c)
		default:
			out = append(out, c)
		}
	}
	return out
}

// PrefixEnd returns the first key after every key starting with prefix (nil:
// no such key, the range is unbounded).
func PrefixEnd(prefix []byte) []byte {
	end := append([]byte(nil), prefix...)
	for i := len(end) - 1; i >= 0; i-- {
		if end[i] != 0xff {
			end[i]++
			return end[:i+1]
		}
	}
	return nil
}
