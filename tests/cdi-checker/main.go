// Command cdi-checker asks the CDI library containerd 2.x uses
// (tags.cncf.io/container-device-interface, the version pinned in go.mod) what it makes
// of spec directories, so the tests can compare the daemon's verdicts with the library's.
//
//	cdi-checker DIR...   one answer for DIRs (lowest priority first), then exit
//	cdi-checker -serve   one JSON array of directories per stdin line, one answer per line
//
// An answer is one JSON object:
//
//	{"files":   {path: {"ok": bool, "error": text, "panic": bool, "devices": [qualified]}},
//	 "devices": [qualified names the cache resolves],
//	 "errors":  {path: [texts the cache recorded]},
//	 "panic":   text (only when the cache's refresh itself panicked)}
//
// "files" holds cdi.ReadSpec's verdict on every *.json and *.yaml entry that is not a
// directory, the way the cache's directory scan chooses them; "devices" and "errors" come
// from a cache built with the same directories and auto-refresh off (containerd's CRI
// plugin builds its cache with cdi.Configure(cdi.WithSpecDirs(...)); the refresh is the
// same). The library panics on some inputs (a null entry in deviceNodes, say): a panic is
// recovered here and reported, where containerd would crash.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"

	"tags.cncf.io/container-device-interface/pkg/cdi"
	"tags.cncf.io/container-device-interface/pkg/parser"
)

type fileVerdict struct {
	OK      bool     `json:"ok"`
	Error   string   `json:"error,omitempty"`
	Panic   bool     `json:"panic,omitempty"`
	Devices []string `json:"devices"`
}

type answer struct {
	Files   map[string]fileVerdict `json:"files"`
	Devices []string               `json:"devices"`
	Errors  map[string][]string    `json:"errors"`
	Panic   string                 `json:"panic,omitempty"`
}

func readSpec(path string, priority int) (verdict fileVerdict) {
	defer func() {
		if r := recover(); r != nil {
			verdict = fileVerdict{Error: fmt.Sprintf("panic: %v", r), Panic: true, Devices: []string{}}
		}
	}()
	spec, err := cdi.ReadSpec(path, priority)
	if err != nil {
		return fileVerdict{Error: err.Error(), Devices: []string{}}
	}
	devices := []string{}
	for _, d := range spec.Devices {
		devices = append(devices, parser.QualifiedName(spec.GetVendor(), spec.GetClass(), d.Name))
	}
	sort.Strings(devices)
	return fileVerdict{OK: true, Devices: devices}
}

func candidates(dir string) []string {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var paths []string
	for _, entry := range entries {
		if entry.IsDir() {
			continue
		}
		if ext := filepath.Ext(entry.Name()); ext != ".json" && ext != ".yaml" {
			continue
		}
		paths = append(paths, filepath.Join(dir, entry.Name()))
	}
	return paths
}

func check(dirs []string) (result answer) {
	result = answer{Files: map[string]fileVerdict{}, Devices: []string{}, Errors: map[string][]string{}}
	for priority, dir := range dirs {
		for _, path := range candidates(dir) {
			result.Files[path] = readSpec(path, priority)
		}
	}
	defer func() {
		if r := recover(); r != nil {
			result.Panic = fmt.Sprint(r)
		}
	}()
	cache, _ := cdi.NewCache(cdi.WithSpecDirs(dirs...), cdi.WithAutoRefresh(false))
	result.Devices = append(result.Devices, cache.ListDevices()...)
	for path, errs := range cache.GetErrors() {
		for _, err := range errs {
			result.Errors[path] = append(result.Errors[path], err.Error())
		}
	}
	return result
}

func main() {
	serve := flag.Bool("serve", false, "answer one JSON array of directories per stdin line")
	flag.Parse()
	out := json.NewEncoder(os.Stdout)
	if !*serve {
		if err := out.Encode(check(flag.Args())); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<24)
	for in.Scan() {
		var dirs []string
		if err := json.Unmarshal(in.Bytes(), &dirs); err != nil {
			fmt.Fprintln(os.Stderr, "cdi-checker: not a JSON array of directories:", err)
			os.Exit(2)
		}
		if err := out.Encode(check(dirs)); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
}
