package envcompat

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// incumbentAppDir is envoyproxy/ratelimit's default RUNTIME_APPDIRECTORY:
// its descriptor files sit in ROOT/SUBDIRECTORY/config.
const incumbentAppDir = "config"

// CheckConfigLayout looks, once at start, for files in the config
// directory path that config.Load would skip although they were meant as
// config (it reads a directory's *.yaml and *.yml files, one level deep,
// skipping names that start with "."). It returns a warning for each such
// subdirectory, or an error where serving without them would change what
// is limited:
//
//   - a subdirectory named config holding descriptor files: path is one
//     level above envoyproxy/ratelimit's app directory (RUNTIME_ROOT/
//     RUNTIME_SUBDIRECTORY instead of .../config), and the files beside it
//     are not the config meant;
//   - with incumbent (envoyproxy/ratelimit's environment, whose loader
//     reads every file in the tree as YAML), any subdirectory holding
//     files, and any file not named *.yaml or *.yml.
//
// A path that is a file, or missing, is left to config.Load.
func CheckConfigLayout(path string, incumbent bool) (warnings []string, err error) {
	entries, err := os.ReadDir(path)
	if err != nil {
		return nil, nil // a file, or missing: config.Load says what is wrong
	}
	var errs []error
	for _, ent := range entries {
		name := ent.Name()
		if strings.HasPrefix(name, ".") {
			continue
		}
		full := filepath.Join(path, name)
		st, err := os.Stat(full) // through links, as a ConfigMap's files are
		if err != nil {
			continue
		}
		if !st.IsDir() {
			if ext := filepath.Ext(name); incumbent && ext != ".yaml" && ext != ".yml" {
				errs = append(errs, fmt.Errorf("%s: not read (ratelimitd reads *.yaml and *.yml files), but envoyproxy/ratelimit loads every file in its config directory: rename it to %s.yaml, or move it out", full, strings.TrimSuffix(name, filepath.Ext(name))))
			}
			continue
		}
		files := dirFiles(full)
		switch {
		case len(files) == 0:
		case incumbent:
			errs = append(errs, fmt.Errorf("%s: a subdirectory, whose files (%s) envoyproxy/ratelimit loads but ratelimitd does not (it reads one directory, not a tree): move them into %s", full, strings.Join(files, ", "), path))
		case name == incumbentAppDir && hasYAML(files):
			errs = append(errs, fmt.Errorf("--config %s: its subdirectory %s holds descriptor files (%s), which are not read (a directory is read one level deep): --config points one level above envoyproxy/ratelimit's app directory; give --config %s", path, name, strings.Join(files, ", "), full))
		case hasYAML(files):
			warnings = append(warnings, fmt.Sprintf("%s: a subdirectory with *.yaml files (%s), which are not read: ratelimitd reads the files of --config %s, one level deep", full, strings.Join(files, ", "), path))
		}
	}
	return warnings, errors.Join(errs...)
}

// dirFiles lists the names of the non-directory entries of dir that do not
// start with ".", sorted.
func dirFiles(dir string) []string {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var names []string
	for _, ent := range entries {
		if strings.HasPrefix(ent.Name(), ".") {
			continue
		}
		if st, err := os.Stat(filepath.Join(dir, ent.Name())); err == nil && !st.IsDir() {
			names = append(names, ent.Name())
		}
	}
	slices.Sort(names)
	return names
}

func hasYAML(names []string) bool {
	return slices.ContainsFunc(names, func(n string) bool {
		ext := filepath.Ext(n)
		return ext == ".yaml" || ext == ".yml"
	})
}
