package peer

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"runtime/debug"
	"sort"
	"sync"
	"time"

	"github.com/go-logr/logr/funcr"
	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
)

// Verbosity of the manager's klog records on stdout: 4 includes the GetPreferredAllocation
// and Allocate calls it makes.
const verbosity = 4

// request is one stdin line.
type request struct {
	ID        int             `json:"id"`
	Op        string          `json:"op"`
	Pod       json.RawMessage `json:"pod"`
	UID       string          `json:"uid"`
	Container string          `json:"container"`
	NUMANodes []int           `json:"numaNodes"`
	Policy    string          `json:"policy"`
}

// output writes one JSON object per line; every line carries t, milliseconds since start.
type output struct {
	mu    sync.Mutex
	w     *bufio.Writer
	start time.Time
}

func (o *output) emit(fields map[string]any) {
	o.mu.Lock()
	defer o.mu.Unlock()
	fields["t"] = float64(time.Since(o.start).Microseconds()) / 1000
	line, err := json.Marshal(fields)
	if err != nil {
		line, _ = json.Marshal(map[string]any{"event": "bug", "error": err.Error()})
	}
	o.w.Write(append(line, '\n'))
	o.w.Flush()
}

// pods is the kubelet's set of active pods, in the order they were added.
type pods struct {
	mu    sync.Mutex
	order []string
	byUID map[string]*v1.Pod
}

func (p *pods) put(pod *v1.Pod) {
	p.mu.Lock()
	defer p.mu.Unlock()
	uid := string(pod.UID)
	if _, ok := p.byUID[uid]; !ok {
		p.order = append(p.order, uid)
	}
	p.byUID[uid] = pod
}

func (p *pods) remove(uid string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.byUID, uid)
	for i, u := range p.order {
		if u == uid {
			p.order = append(p.order[:i], p.order[i+1:]...)
			break
		}
	}
}

func (p *pods) get(uid string) (*v1.Pod, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if pod, ok := p.byUID[uid]; ok {
		return pod, nil
	}
	return nil, fmt.Errorf("no active pod with uid %q", uid)
}

func (p *pods) active() []*v1.Pod {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]*v1.Pod, 0, len(p.order))
	for _, uid := range p.order {
		out = append(out, p.byUID[uid])
	}
	return out
}

func (p *pods) others(uid string) []*v1.Pod {
	var out []*v1.Pod
	for _, pod := range p.active() {
		if string(pod.UID) != uid {
			out = append(out, pod)
		}
	}
	return out
}

func findContainer(pod *v1.Pod, name string) (*v1.Container, error) {
	for _, list := range [][]v1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for i := range list {
			if list[i].Name == name {
				return &list[i], nil
			}
		}
	}
	return nil, fmt.Errorf("pod %s has no container %q", pod.UID, name)
}

func kubernetesVersion() string {
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, dep := range info.Deps {
			if dep.Path == "k8s.io/kubernetes" {
				return dep.Version
			}
		}
	}
	return "unknown"
}

// Main runs the driver: enter the kubelet directory, then serve stdin until EOF or stop.
func Main(k Kubelet) {
	out := &output{w: bufio.NewWriter(os.Stdout), start: time.Now()}
	source := flag.String("kubelet-dir", "", "directory to mount at "+KubeletDir+" (required)")
	flag.Parse()
	fail := func(err error) {
		out.emit(map[string]any{"event": "fatal", "error": err.Error()})
		os.Exit(1)
	}
	if *source == "" {
		fail(errors.New("-kubelet-dir is required"))
	}
	if err := EnterKubeletDir(*source); err != nil {
		fail(err)
	}
	// Both klog entry points (global klog.V().InfoS in older releases, contextual
	// loggers in newer ones) end in this sink, one "log" event per record.
	flags := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(flags)
	_ = flags.Set("v", fmt.Sprint(verbosity))
	klog.SetLogger(funcr.NewJSON(func(obj string) {
		out.emit(map[string]any{"event": "log", "record": json.RawMessage(obj)})
	}, funcr.Options{Verbosity: verbosity}))

	active := &pods{byUID: map[string]*v1.Pod{}}
	out.emit(map[string]any{"event": "ready", "kubernetes": kubernetesVersion(), "kubeletDir": KubeletDir})
	scanner := bufio.NewScanner(os.Stdin)
	scanner.Buffer(make([]byte, 1<<20), 1<<24)
	for scanner.Scan() {
		var req request
		if err := json.Unmarshal(scanner.Bytes(), &req); err != nil {
			out.emit(map[string]any{"event": "bad-request", "error": err.Error()})
			continue
		}
		result, err := handle(k, active, out, &req)
		reply := map[string]any{"id": req.ID, "op": req.Op, "ok": err == nil}
		if err != nil {
			reply["error"] = err.Error()
		} else {
			reply["result"] = result
		}
		out.emit(reply)
		if req.Op == "stop" && err == nil {
			os.Exit(0)
		}
	}
	// stdin closed: the process ends as a killed kubelet would, without stopping anything.
}

func handle(k Kubelet, active *pods, out *output, req *request) (any, error) {
	switch req.Op {
	case "start":
		policy := req.Policy
		if policy == "" {
			policy = "none" // the kubelet's default topology manager policy
		}
		startedAt := float64(time.Since(out.start).Microseconds()) / 1000
		if err := k.Start(req.NUMANodes, policy, active.active); err != nil {
			return nil, err
		}
		go func() {
			for uids := range k.PodUpdates() {
				sort.Strings(uids)
				out.emit(map[string]any{"event": "pod-update", "podUIDs": uids})
			}
		}()
		return map[string]any{"startedAt": startedAt, "policy": policy}, nil
	case "pod":
		var pod v1.Pod
		if err := json.Unmarshal(req.Pod, &pod); err != nil {
			return nil, fmt.Errorf("bad pod: %w", err)
		}
		if pod.UID == "" {
			return nil, errors.New("pod has no metadata.uid")
		}
		active.put(&pod)
		return nil, nil
	case "forget":
		// The pod is gone: the next allocation (or this call) releases its devices.
		active.remove(req.UID)
		k.UpdateAllocatedDevices()
		return nil, nil
	case "capacity":
		return k.Capacity(), nil
	case "allocatable":
		return k.AllocatableDevices(), nil
	case "affinity":
		return k.Affinity(req.UID, req.Container), nil
	case "devices":
		return k.ContainerDevices(req.UID, req.Container), nil
	case "stop":
		return nil, k.Stop()
	}
	pod, err := active.get(req.UID)
	if err != nil {
		return nil, err
	}
	switch req.Op {
	case "admit":
		return k.Admit(pod, active.others(req.UID)), nil
	case "status":
		status := v1.PodStatus{}
		for _, c := range pod.Spec.Containers {
			status.ContainerStatuses = append(status.ContainerStatuses, v1.ContainerStatus{Name: c.Name})
		}
		gate := k.AllocatedResourcesStatus(pod, &status)
		return map[string]any{"gate": gate, "containerStatuses": status.ContainerStatuses}, nil
	}
	container, err := findContainer(pod, req.Container)
	if err != nil {
		return nil, err
	}
	switch req.Op {
	case "options":
		return k.RunContainerOptions(pod, container)
	case "hints":
		return k.TopologyHints(pod, container), nil
	}
	return nil, fmt.Errorf("unknown op %q", req.Op)
}
