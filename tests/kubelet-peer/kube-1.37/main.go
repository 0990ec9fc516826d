// The device manager of Kubernetes 1.37, driven by the shared peer protocol.
package main

import (
	"context"

	cadvisorapi "github.com/google/cadvisor/lib/model"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/features"
	"k8s.io/kubernetes/pkg/kubelet/cm/containermap"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"
	"k8s.io/kubernetes/pkg/kubelet/lifecycle"

	"kubeletpeer/peer"
)

type kubelet struct {
	logger   klog.Logger
	ctx      context.Context
	topology topologymanager.Manager
	devices  *devicemanager.ManagerImpl
	updates  chan []string
}

// Start wires the managers as container_manager_linux.go's NewContainerManager and
// Start do: topology manager, device manager as its hint provider, then Start.
func (k *kubelet) Start(numaNodes []int, policy string, activePods func() []*v1.Pod) error {
	k.logger = klog.Background()
	k.ctx = klog.NewContext(context.Background(), k.logger)
	machine := make([]cadvisorapi.Node, 0, len(numaNodes))
	for _, id := range numaNodes {
		machine = append(machine, cadvisorapi.Node{Id: id})
	}
	tm, err := topologymanager.NewManager(k.logger, machine, policy, "container", nil)
	if err != nil {
		return err
	}
	dm, err := devicemanager.NewManagerImpl(k.logger, machine, tm)
	if err != nil {
		return err
	}
	tm.AddHintProvider(k.logger, dm)
	k.topology, k.devices = tm, dm
	k.updates = make(chan []string)
	go func() {
		for update := range dm.Updates() {
			k.updates <- update.PodUIDs
		}
	}()
	return dm.Start(k.logger, devicemanager.ActivePodsFunc(activePods), peer.SourcesReady{},
		containermap.NewContainerMap(), sets.New[string]())
}

func (k *kubelet) Admit(pod *v1.Pod, others []*v1.Pod) peer.Admission {
	result := k.topology.Admit(k.ctx, &lifecycle.PodAdmitAttributes{
		Pod: pod, OtherPods: others, Operation: lifecycle.AddOperation,
	})
	return peer.Admission{Admit: result.Admit, Reason: result.Reason, Message: result.Message}
}

func (k *kubelet) RunContainerOptions(pod *v1.Pod, container *v1.Container) (any, error) {
	return k.devices.GetDeviceRunContainerOptions(k.ctx, pod, container)
}

func (k *kubelet) Capacity() peer.Capacity {
	return peer.NewCapacity(k.devices.GetCapacity(k.logger))
}

func hint(h topologymanager.TopologyHint) peer.Hint {
	out := peer.Hint{Preferred: h.Preferred}
	if h.NUMANodeAffinity != nil {
		out.NUMANodes = h.NUMANodeAffinity.GetBits()
	}
	return out
}

func (k *kubelet) TopologyHints(pod *v1.Pod, container *v1.Container) map[string][]peer.Hint {
	out := map[string][]peer.Hint{}
	for resource, hints := range k.devices.GetTopologyHints(k.logger, pod, container, lifecycle.AddOperation) {
		out[resource] = []peer.Hint{}
		for _, h := range hints {
			out[resource] = append(out[resource], hint(h))
		}
	}
	return out
}

func (k *kubelet) Affinity(podUID, container string) peer.Hint {
	return hint(k.topology.GetAffinity(k.logger, podUID, container))
}

func (k *kubelet) ContainerDevices(podUID, container string) map[string][]peer.Device {
	return peer.Devices(k.devices.GetDevices(podUID, container))
}

func (k *kubelet) AllocatableDevices() map[string][]peer.Device {
	return peer.Devices(k.devices.GetAllocatableDevices(k.logger))
}

func (k *kubelet) UpdateAllocatedDevices() { k.devices.UpdateAllocatedDevices(k.logger) }

// AllocatedResourcesStatus: the kubelet's status path calls it only with the gate on
// (kubelet_pods.go).
func (k *kubelet) AllocatedResourcesStatus(pod *v1.Pod, status *v1.PodStatus) bool {
	if !utilfeature.DefaultFeatureGate.Enabled(features.ResourceHealthStatus) {
		return false
	}
	k.devices.UpdateAllocatedResourcesStatus(k.logger, pod, status)
	return true
}

func (k *kubelet) PodUpdates() <-chan []string { return k.updates }

func (k *kubelet) Stop() error { return k.devices.Stop(k.logger) }

func main() { peer.Main(&kubelet{}) }
