// Package peer drives one kubelet version's device manager from a line protocol.
//
// The version-specific part (constructing the manager and calling it: signatures change
// between releases) implements Kubelet; everything else (the protocol, the pods, the
// mount namespace, the log stream) is shared by every version.
package peer

import (
	"sort"

	v1 "k8s.io/api/core/v1"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// Hint is one topology hint: the NUMA nodes of a possible allocation (nil: any).
type Hint struct {
	NUMANodes []int `json:"numaNodes"`
	Preferred bool  `json:"preferred"`
}

// Admission is the topology manager's admit verdict (the kubelet's pod admit handler).
type Admission struct {
	Admit   bool   `json:"admit"`
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
}

// Capacity is GetCapacity's answer, per resource name.
type Capacity struct {
	Capacity    map[string]int64 `json:"capacity"`
	Allocatable map[string]int64 `json:"allocatable"`
	Deleted     []string         `json:"deleted"`
}

// NewCapacity turns GetCapacity's resource lists (the same types in every version) into a
// Capacity.
func NewCapacity(capacity, allocatable v1.ResourceList, deleted []string) Capacity {
	c := Capacity{Capacity: map[string]int64{}, Allocatable: map[string]int64{}, Deleted: deleted}
	for name, q := range capacity {
		c.Capacity[string(name)] = q.Value()
	}
	for name, q := range allocatable {
		c.Allocatable[string(name)] = q.Value()
	}
	return c
}

// Device is one device as the manager knows it.
type Device struct {
	ID     string  `json:"id"`
	Health string  `json:"health"`
	NUMA   []int64 `json:"numa"`
}

// Kubelet is one kubelet version's device manager, wired as the kubelet wires it: a
// topology manager (the pod admit handler) with the device manager as hint provider.
type Kubelet interface {
	Start(numaNodes []int, policy string, activePods func() []*v1.Pod) error
	// Admit runs the topology manager's admission: hints, then Allocate per container
	// (init containers first), as the kubelet admits a pod.
	Admit(pod *v1.Pod, others []*v1.Pod) Admission
	// RunContainerOptions is GetDeviceRunContainerOptions (what the runtime gets).
	RunContainerOptions(pod *v1.Pod, container *v1.Container) (any, error)
	Capacity() Capacity
	TopologyHints(pod *v1.Pod, container *v1.Container) map[string][]Hint
	Affinity(podUID, container string) Hint
	ContainerDevices(podUID, container string) map[string][]Device
	AllocatableDevices() map[string][]Device
	UpdateAllocatedDevices()
	// AllocatedResourcesStatus fills status as the kubelet does when ResourceHealthStatus
	// is enabled; false when the gate is off (status untouched).
	AllocatedResourcesStatus(pod *v1.Pod, status *v1.PodStatus) bool
	// PodUpdates carries the pod UIDs the manager asks the kubelet to refresh.
	PodUpdates() <-chan []string
	Stop() error
}

// Devices converts a ResourceDeviceInstances (resource -> ID -> device), IDs sorted.
func Devices[R ~map[string]I, I ~map[string]*pluginapi.Device](instances R) map[string][]Device {
	out := make(map[string][]Device, len(instances))
	for resource, byID := range instances {
		list := make([]Device, 0, len(byID))
		for id, dev := range byID {
			d := Device{ID: id, Health: dev.GetHealth(), NUMA: []int64{}}
			for _, node := range dev.GetTopology().GetNodes() {
				d.NUMA = append(d.NUMA, node.GetID())
			}
			list = append(list, d)
		}
		sort.Slice(list, func(i, j int) bool { return list[i].ID < list[j].ID })
		out[resource] = list
	}
	return out
}

// SourcesReady is the kubelet tests' stub: every pod source has been seen.
type SourcesReady struct{}

func (SourcesReady) AddSource(string) {}
func (SourcesReady) AllReady() bool   { return true }
