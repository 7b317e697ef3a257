package usage

import "bytes"

// An event stream is read line by line as the HTML standard's
// "interpreting an event stream" says: a line ends at "\r\n", "\n" or
// "\r"; a line "data:<value>" (one space after the colon dropped) or "data"
// adds its value to the event's data, the values joined by "\n"; an empty
// line ends the event; comments (":...") and other fields are ignored.
// Only a BOM at the stream's start is read byte by byte; the rest goes by
// whole slices through the standard library's compiled code (IndexAny,
// append, a comparison with "data:"), which costs the interpreter a few
// calls per line rather than per byte (doc.go in the root: frames).

// newline joins the data lines of an event.
var newline = []byte{'\n'}

// unicodeEscape starts a JSON escape that may write any character.
var unicodeEscape = []byte(`\u`)

// feedStream reads a chunk of an event stream.
func feedStream(r *Reader, b []byte) {
	for len(b) > 0 {
		if r.cr {
			r.cr = false

			if b[0] == '\n' {
				b = b[1:]
				continue
			}
		}

		i := bytes.IndexAny(b, "\r\n")
		if i < 0 {
			addToLine(r, b)
			return
		}

		if i > 0 {
			addToLine(r, b[:i])
		}

		endLine(r)

		r.cr = b[i] == '\r'
		b = b[i+1:]
	}
}

// addToLine reads seg, a part of the current line without its ending.
func addToLine(r *Reader, seg []byte) {
	for len(seg) > 0 {
		switch r.phase {
		case phaseData:
			appendData(r, seg)
			return
		case phaseSkip:
			return
		case phaseSpace:
			r.phase = phaseData

			if seg[0] == ' ' {
				seg = seg[1:]
			}
		default:
			seg = matchStart(r, seg)
		}
	}
}

// matchStart reads the start of seg against what may begin a line (the BOM
// of the stream's first line, then "data:") and returns the rest of seg.
// It compares as many bytes as seg holds at once: a line is rarely split
// inside "data:".
func matchStart(r *Reader, seg []byte) []byte {
	if r.phase == phaseBOM {
		return matchBOM(r, seg)
	}

	k := len(dataField) - r.matched
	if k > len(seg) {
		k = len(seg)
	}

	if string(seg[:k]) != dataField[r.matched:r.matched+k] {
		r.phase = phaseSkip
		return nil
	}

	r.matched += k

	if r.matched == len(dataField) {
		startData(r)
		r.phase = phaseSpace
	}

	return seg[k:]
}

// matchBOM reads one byte of the stream's first line against the UTF-8 BOM,
// which is not part of the line; a line that starts with part of it only
// is no data line.
func matchBOM(r *Reader, seg []byte) []byte {
	if seg[0] == byteOrder[r.matched] {
		r.matched++

		if r.matched == len(byteOrder) {
			r.matched = 0
			r.phase = phaseField
		}

		return seg[1:]
	}

	if r.matched > 0 {
		r.phase = phaseSkip
		return nil
	}

	r.phase = phaseField

	return seg
}

// endLine ends the current line: an empty one ends the event, a bare "data"
// is a data line with an empty value.
func endLine(r *Reader) {
	if r.phase <= phaseField {
		if r.matched == 0 {
			endEvent(r)
		} else if r.phase == phaseField && r.matched == len(dataField)-1 {
			startData(r)
		}
	}

	r.phase = phaseField
	r.matched = 0
}

// startData starts a data line of the current event.
func startData(r *Reader) {
	if r.dataLines > 0 {
		appendData(r, newline)
	}

	r.dataLines++
}

// appendData adds b to the current event's data, or skips the event once
// its data passes MaxEventBytes.
func appendData(r *Reader, b []byte) {
	if r.over {
		return
	}

	if len(r.buf)+len(b) > MaxEventBytes {
		r.over = true
		r.buf = r.buf[:0]

		return
	}

	r.buf = appendBounded(r.buf, b, MaxEventBytes)
}

// endEvent ends the current event: its data, when it holds the path with a
// valid cost, is the stream's cost so far.
func endEvent(r *Reader) {
	// Most events of a stream lack the path's last segment in quotes and
	// skip the decoding, unless a \u escape could hide it (NewReader: quoted).
	if r.dataLines > 0 && !r.over && (r.quoted == nil || bytes.Contains(r.buf, r.quoted) || bytes.Contains(r.buf, unicodeEscape)) {
		if r.expr != nil {
			eventTerms(r)
		} else if cost, ok := lookup(r.buf, r.path); ok {
			r.cost = cost
			r.ok = true
		}
	}

	r.buf = r.buf[:0]
	r.dataLines = 0
	r.over = false
}
