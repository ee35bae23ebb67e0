// ascend-oracle: HAMi v2.10.0's Ascend vendor (pkg/device/ascend) answering the cases Tessera's
// differential test generates (tools/gen/ascend_cases.py), one JSON object per line on stdin and
// one answer per line on stdout, in the same order. Written for Tessera's tests; HAMi's code is
// used as a library only. See test/hami/README.md.
//
// Each case names a chip (HAMi's VNPUConfig in JSON, keys as in the device config) and an op:
//
//	request   limits, requests          -> GenerateResourceRequests
//	admit     limits, requests, annotations -> MutateAdmission (found, error, the resources after)
//	register  value                     -> GetNodeDevices of a node with that registration
//	fit       devices (registration and usage, in registration order), limits, annotations
//	          (the GPU policy among them), nodeAnnotations, hamiVnpuCore
//	                                    -> the scheduler's device sort, then Fit, 40 times: the
//	                                       distinct answers (HAMi breaks some ties in map order)
//	patch     devices (per container), annotations -> PatchAnnotations (without predicate-time)
//	score     devices (per container), registration -> ScoreNode
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"

	"github.com/Project-HAMi/HAMi/pkg/device"
	"github.com/Project-HAMi/HAMi/pkg/device/ascend"
	"github.com/Project-HAMi/HAMi/pkg/scheduler/policy"
	"github.com/Project-HAMi/HAMi/pkg/util"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
)

type usage struct {
	device.DeviceInfo
	Used      int32 `json:"used"`
	Usedmem   int32 `json:"usedmem"`
	Usedcores int32 `json:"usedcores"`
}

type testCase struct {
	Op              string                 `json:"op"`
	Chip            json.RawMessage        `json:"chip"`
	HamiVnpuCore    bool                   `json:"hamiVnpuCore"`
	Limits          map[string]string      `json:"limits"`
	Requests        map[string]string      `json:"requests"`
	Annotations     map[string]string      `json:"annotations"`
	NodeAnnotations map[string]string      `json:"nodeAnnotations"`
	Value           string                 `json:"value"`
	Devices         []usage                `json:"devices"`
	PodDevices      device.PodSingleDevice `json:"podDevices"`
}

type answer map[string]any

func resources(m map[string]string) (corev1.ResourceList, error) {
	if m == nil {
		return nil, nil
	}
	out := corev1.ResourceList{}
	for k, v := range m {
		q, err := resource.ParseQuantity(v)
		if err != nil {
			return nil, fmt.Errorf("%s: %v", k, err)
		}
		out[corev1.ResourceName(k)] = q
	}
	return out, nil
}

func quantities(l corev1.ResourceList) map[string]string {
	if l == nil {
		return nil
	}
	out := map[string]string{}
	for k, v := range l {
		out[string(k)] = v.String()
	}
	return out
}

func chipDevice(c testCase) (*ascend.Devices, error) {
	var chip ascend.VNPUConfig
	if err := json.Unmarshal(c.Chip, &chip); err != nil {
		return nil, err
	}
	devs := ascend.InitDevices(ascend.VNPUs{HamiVnpuCore: c.HamiVnpuCore, Configs: []ascend.VNPUConfig{chip}})
	if len(devs) != 1 {
		return nil, fmt.Errorf("InitDevices made %d devices", len(devs))
	}
	return devs[0], nil
}

func container(c testCase) (*corev1.Container, error) {
	limits, err := resources(c.Limits)
	if err != nil {
		return nil, err
	}
	requests, err := resources(c.Requests)
	if err != nil {
		return nil, err
	}
	return &corev1.Container{Name: "main", Resources: corev1.ResourceRequirements{Limits: limits, Requests: requests}}, nil
}

func pod(c testCase, ctr *corev1.Container) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "default", Annotations: c.Annotations}}
	if ctr != nil {
		p.Spec.Containers = []corev1.Container{*ctr}
	}
	return p
}

func fitOnce(dev *ascend.Devices, c testCase, req device.ContainerDeviceRequest, p *corev1.Pod) answer {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", Annotations: c.NodeAnnotations}}
	info := &device.NodeInfo{ID: "n", Node: node, Devices: map[string][]device.DeviceInfo{}}
	// The pod's GPU policy, else the scheduler's default (--gpu-scheduler-policy spread).
	list := policy.DeviceUsageList{Policy: util.GetGPUSchedulerPolicyByPod(device.GPUSchedulerPolicy, p)}
	for _, d := range c.Devices {
		info.Devices[dev.CommonWord()] = append(info.Devices[dev.CommonWord()], d.DeviceInfo)
		list.DeviceLists = append(list.DeviceLists, &policy.DeviceListsScore{Device: &device.DeviceUsage{
			ID: d.ID, Index: d.Index, Used: d.Used, Count: d.Count, Usedmem: d.Usedmem, Totalmem: d.Devmem,
			Totalcore: d.Devcore, Usedcores: d.Usedcores, Numa: d.Numa, Type: d.Type, Health: d.Health,
			CustomInfo: d.CustomInfo,
		}})
	}
	for _, l := range list.DeviceLists {
		l.ComputeScore(device.ContainerDeviceRequests{req.Type: req}, util.DeviceScoringWeights{Slot: 1, Core: 1, Memory: 1})
	}
	sort.Sort(list)
	var typed []*device.DeviceUsage
	for _, l := range list.DeviceLists {
		if strings.Contains(strings.ToLower(l.Device.Type), strings.ToLower(req.Type)) {
			typed = append(typed, l.Device)
		}
	}
	if int(req.Nums) > len(typed) {
		return answer{"fit": false, "reason": fmt.Sprintf("%d/%d NodeInsufficientDevice", req.Nums, len(typed))}
	}
	fit, devs, reason := dev.Fit(typed, req, p, info, &device.PodDevices{})
	var ids []string
	if fit {
		for _, d := range devs[req.Type] {
			ids = append(ids, d.UUID)
		}
	}
	return answer{"fit": fit, "reason": reason, "uuids": ids}
}

func run(c testCase) answer {
	dev, err := chipDevice(c)
	if err != nil {
		return answer{"bad": err.Error()}
	}
	switch c.Op {
	case "request":
		ctr, err := container(c)
		if err != nil {
			return answer{"bad": err.Error()}
		}
		r := dev.GenerateResourceRequests(ctr)
		return answer{"nums": r.Nums, "type": r.Type, "memreq": r.Memreq, "pct": r.MemPercentagereq, "cores": r.Coresreq}
	case "admit":
		ctr, err := container(c)
		if err != nil {
			return answer{"bad": err.Error()}
		}
		p := pod(c, ctr)
		found, err := dev.MutateAdmission(&p.Spec.Containers[0], p)
		out := answer{"found": found}
		if err != nil {
			out["error"] = err.Error()
			return out
		}
		after := p.Spec.Containers[0]
		out["limits"] = quantities(after.Resources.Limits)
		out["requests"] = quantities(after.Resources.Requests)
		out["env"] = len(after.Env)
		if p.Spec.RuntimeClassName != nil {
			out["runtimeClassName"] = *p.Spec.RuntimeClassName
		}
		return out
	case "register":
		node := corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", Annotations: map[string]string{
			fmt.Sprintf("hami.io/node-register-%s", dev.CommonWord()): c.Value}}}
		devs, err := dev.GetNodeDevices(node)
		if err != nil {
			return answer{"error": err.Error()}
		}
		return answer{"devices": devs}
	case "fit":
		ctr, err := container(c)
		if err != nil {
			return answer{"bad": err.Error()}
		}
		req := dev.GenerateResourceRequests(ctr)
		if req.Nums == 0 {
			return answer{"bad": "no request"}
		}
		p := pod(c, ctr)
		seen := map[string]answer{}
		for range 40 {
			a := fitOnce(dev, c, req, p)
			b, _ := json.Marshal(a)
			seen[string(b)] = a
		}
		var keys []string
		for k := range seen {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		var answers []answer
		for _, k := range keys {
			answers = append(answers, seen[k])
		}
		return answer{"answers": answers}
	case "patch":
		p := pod(c, nil)
		annos := map[string]string{}
		dev.PatchAnnotations(p, &annos, device.PodDevices{dev.CommonWord(): c.PodDevices})
		delete(annos, "predicate-time")
		return answer{"annotations": annos}
	case "score":
		podDevices := c.PodDevices
		for _, ctr := range podDevices {
			for i := range ctr {
				for _, d := range c.Devices {
					if d.ID == ctr[i].UUID {
						ctr[i].CustomInfo = d.CustomInfo
					}
				}
			}
		}
		return answer{"score": dev.ScoreNode(&corev1.Node{}, podDevices, nil, "")}
	}
	return answer{"bad": "unknown op " + c.Op}
}

func main() {
	fs := flag.NewFlagSet("ascend-oracle", flag.ExitOnError)
	ascend.ParseConfig(fs)
	klog.InitFlags(fs)
	if err := fs.Parse(append([]string{"--enable-ascend=true", "-v=0", "--logtostderr=false", "--stderrthreshold=FATAL"}, os.Args[1:]...)); err != nil {
		os.Exit(2)
	}
	device.GPUSchedulerPolicy = util.GPUSchedulerPolicySpread.String()
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<26)
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	for in.Scan() {
		var c testCase
		var a answer
		if err := json.Unmarshal(in.Bytes(), &c); err != nil {
			a = answer{"bad": err.Error()}
		} else {
			a = run(c)
		}
		b, err := json.Marshal(a)
		if err != nil {
			b = []byte(`{"bad":"marshal"}`)
		}
		out.Write(b)
		out.WriteByte('\n')
	}
	if err := in.Err(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
