module cdichecker

go 1.26.0

require tags.cncf.io/container-device-interface v1.1.1

require (
	github.com/fsnotify/fsnotify v1.10.1 // indirect
	github.com/opencontainers/runtime-spec v1.3.0 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/sys v0.48.0 // indirect
	tags.cncf.io/container-device-interface/specs-go v1.1.1 // indirect
)
