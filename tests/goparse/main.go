// Command goparse answers, for each JSON string read from stdin (one per line), what
// Go's time.ParseDuration, strconv.ParseInt(s, 0, 64) and strconv.ParseBool make of
// it: the oracle the daemon's own parsers are held to (tests/test_goparse.py).
package main

import (
	"bufio"
	"encoding/json"
	"os"
	"strconv"
	"time"
)

type verdict struct {
	DurationOK bool   `json:"durationOk"`
	Nanos      int64  `json:"nanos"`
	IntOK      bool   `json:"intOk"`
	Int        string `json:"int"`
	BoolOK     bool   `json:"boolOk"`
	Bool       bool   `json:"bool"`
}

func main() {
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<20)
	out := bufio.NewWriter(os.Stdout)
	encoder := json.NewEncoder(out)
	for in.Scan() {
		var text string
		if err := json.Unmarshal(in.Bytes(), &text); err != nil {
			panic(err)
		}
		var answer verdict
		if d, err := time.ParseDuration(text); err == nil {
			answer.DurationOK, answer.Nanos = true, int64(d)
		}
		if n, err := strconv.ParseInt(text, 0, 64); err == nil {
			answer.IntOK, answer.Int = true, strconv.FormatInt(n, 10)
		}
		if b, err := strconv.ParseBool(text); err == nil {
			answer.BoolOK, answer.Bool = true, b
		}
		if err := encoder.Encode(answer); err != nil {
			panic(err)
		}
		out.Flush()
	}
}
