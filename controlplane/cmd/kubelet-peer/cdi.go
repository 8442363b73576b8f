package main

// What a CDI-aware container runtime (containerd 2, CRI-O) does with the CDI device names the
// kubelet passes in the CRI: it looks each "<vendor>/<class>=<name>" up in the CDI spec files of
// its spec folders and applies the spec's and the device's container edits (environment, device
// nodes, mounts) to the container. The peer does the same, so its record of what each container
// received holds a DRA container's environment and devices as it holds a device plugin's. Only
// JSON specs are read (the DRA drivers here write JSON); hooks are left out (no process runs).
// When two folders define the same device, the later folder wins, as in the CDI spec.

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

type cdiDeviceNode struct {
	Path        string `json:"path"`
	HostPath    string `json:"hostPath"`
	Permissions string `json:"permissions"`
}

type cdiMount struct {
	HostPath      string   `json:"hostPath"`
	ContainerPath string   `json:"containerPath"`
	Options       []string `json:"options"`
}

type cdiEdits struct {
	Env         []string        `json:"env"`
	DeviceNodes []cdiDeviceNode `json:"deviceNodes"`
	Mounts      []cdiMount      `json:"mounts"`
}

type cdiSpecFile struct {
	Kind           string   `json:"kind"`
	ContainerEdits cdiEdits `json:"containerEdits"`
	Devices        []struct {
		Name           string   `json:"name"`
		ContainerEdits cdiEdits `json:"containerEdits"`
	} `json:"devices"`
}

// resolveCDI returns, per qualified device name, the edits it brings (the spec's own first).
func resolveCDI(dirs []string, names []string) ([]cdiEdits, error) {
	known := map[string][]cdiEdits{}
	for _, dir := range dirs {
		files, err := filepath.Glob(filepath.Join(dir, "*.json"))
		if err != nil {
			return nil, err
		}
		sort.Strings(files)
		for _, file := range files {
			if err := readCDISpec(file, known); err != nil {
				return nil, err
			}
		}
	}
	var edits []cdiEdits
	for _, name := range names {
		found, ok := known[name]
		if !ok {
			return nil, fmt.Errorf("unresolvable CDI devices %s (no spec in %s)", name, strings.Join(dirs, ", "))
		}
		edits = append(edits, found...)
	}
	return edits, nil
}

func readCDISpec(file string, known map[string][]cdiEdits) error {
	text, err := os.ReadFile(file)
	if os.IsNotExist(err) {
		return nil // removed between the listing and the read (an unprepare)
	}
	if err != nil {
		return err
	}
	var spec cdiSpecFile
	if err := json.Unmarshal(text, &spec); err != nil {
		return fmt.Errorf("CDI spec %s: %w", file, err)
	}
	for _, device := range spec.Devices {
		known[spec.Kind+"="+device.Name] = []cdiEdits{spec.ContainerEdits, device.ContainerEdits}
	}
	return nil
}

// applyCDI adds the edits to what the container receives, after the device plugins' part.
func applyCDI(spec *containerRuntimeSpec, edits []cdiEdits) error {
	for _, edit := range edits {
		for _, env := range edit.Env {
			name, value, ok := strings.Cut(env, "=")
			if !ok {
				return fmt.Errorf("CDI env %q is not NAME=VALUE", env)
			}
			spec.Envs[name] = value
		}
		for _, node := range edit.DeviceNodes {
			host, permissions := node.HostPath, node.Permissions
			if host == "" {
				host = node.Path
			}
			if permissions == "" {
				permissions = "rwm"
			}
			spec.Devices = append(spec.Devices, deviceMount{host, node.Path, permissions})
		}
		for _, mount := range edit.Mounts {
			readOnly := false
			for _, option := range mount.Options {
				readOnly = readOnly || option == "ro"
			}
			spec.Mounts = append(spec.Mounts, volumeMount{mount.HostPath, mount.ContainerPath, readOnly})
		}
	}
	return nil
}
