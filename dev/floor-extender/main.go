// floor-extender: a kube-scheduler extender that decides nothing, for `rocshare-dev bench floor`
// (dev/rocshare_dev/bench/floor.py). It speaks rocshare's extender protocol (filter and bind,
// node cache) at the least cost a process can: filter keeps the nodes with the fewest pods it
// has bound (the bench pool's spread policy, at most --gpus-per-node pods a node), bind posts the
// Binding carrying the annotations of a rocshare record (--annotations, a JSON object; @NODE@ in a
// value becomes the node's name). What the bench measures with it is what rocshare's configuration
// costs kube-apiserver, kube-scheduler and the kubelet when rocshare's own processes cost nothing.
// Harness only: it allocates no GPU and writes no real record.
package main

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"strings"
	"sync"
)

type extenderArgs struct {
	NodeNames []string `json:"nodenames"`
}

type bindingArgs struct {
	PodName      string `json:"podName"`
	PodNamespace string `json:"podNamespace"`
	PodUID       string `json:"podUID"`
	Node         string `json:"node"`
}

type floor struct {
	server      string
	client      *http.Client
	annotations map[string]string
	podsPerNode int

	mu    sync.Mutex
	bound map[string]int // pods bound per node since the last /reset
	binds int
}

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address to serve the extender on")
	server := flag.String("server", "", "kube-apiserver URL")
	cert := flag.String("cert", "", "client certificate (PEM)")
	key := flag.String("key", "", "client key (PEM)")
	ca := flag.String("ca", "", "kube-apiserver CA (PEM)")
	annotations := flag.String("annotations", "", "JSON object of annotations each Binding carries")
	podsPerNode := flag.Int("gpus-per-node", 8, "pods a node takes (one GPU each)")
	flag.Parse()
	f, err := newFloor(*server, *cert, *key, *ca, *annotations, *podsPerNode)
	if err != nil {
		log.Fatalf("floor-extender: %v", err)
	}
	http.HandleFunc("/extender/filter", f.filter)
	http.HandleFunc("/extender/bind", f.bind)
	http.HandleFunc("/reset", f.reset)
	http.HandleFunc("/binds", f.count)
	log.Fatal(http.ListenAndServe(*listen, nil))
}

func newFloor(server, certPath, keyPath, caPath, annotationsPath string, podsPerNode int) (*floor, error) {
	cert, err := tls.LoadX509KeyPair(certPath, keyPath)
	if err != nil {
		return nil, err
	}
	caPEM, err := os.ReadFile(caPath)
	if err != nil {
		return nil, err
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("%s holds no PEM certificate", caPath)
	}
	annotations := map[string]string{}
	if annotationsPath != "" {
		data, err := os.ReadFile(annotationsPath)
		if err != nil {
			return nil, err
		}
		if err := json.Unmarshal(data, &annotations); err != nil {
			return nil, fmt.Errorf("%s: %v", annotationsPath, err)
		}
	}
	transport := &http.Transport{ForceAttemptHTTP2: true, MaxIdleConnsPerHost: 64,
		TLSClientConfig: &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: roots}}
	return &floor{server: server, client: &http.Client{Transport: transport}, annotations: annotations,
		podsPerNode: podsPerNode, bound: map[string]int{}}, nil
}

func (f *floor) filter(w http.ResponseWriter, r *http.Request) {
	var args extenderArgs
	if err := json.NewDecoder(r.Body).Decode(&args); err != nil {
		reply(w, map[string]any{"error": err.Error()})
		return
	}
	keep, failed := []string{}, map[string]string{}
	f.mu.Lock()
	fewest := f.podsPerNode
	for _, name := range args.NodeNames {
		fewest = min(fewest, f.bound[name])
	}
	for _, name := range args.NodeNames {
		if f.bound[name] == fewest && fewest < f.podsPerNode {
			keep = append(keep, name)
		} else {
			failed[name] = "not among the emptiest nodes"
		}
	}
	f.mu.Unlock()
	reply(w, map[string]any{"nodenames": keep, "failedNodes": failed, "error": ""})
}

func (f *floor) bind(w http.ResponseWriter, r *http.Request) {
	var args bindingArgs
	if err := json.NewDecoder(r.Body).Decode(&args); err != nil {
		reply(w, map[string]string{"error": err.Error()})
		return
	}
	f.mu.Lock()
	f.bound[args.Node]++
	f.binds++
	f.mu.Unlock()
	if err := f.postBinding(args); err != nil {
		f.mu.Lock()
		f.bound[args.Node]--
		f.binds--
		f.mu.Unlock()
		reply(w, map[string]string{"error": err.Error()})
		return
	}
	reply(w, map[string]string{"error": ""})
}

func (f *floor) postBinding(args bindingArgs) error {
	annotations := make(map[string]string, len(f.annotations))
	for key, value := range f.annotations {
		annotations[key] = strings.ReplaceAll(value, "@NODE@", args.Node)
	}
	body, err := json.Marshal(map[string]any{"apiVersion": "v1", "kind": "Binding",
		"metadata": map[string]any{"name": args.PodName, "namespace": args.PodNamespace, "uid": args.PodUID,
			"annotations": annotations},
		"target": map[string]string{"apiVersion": "v1", "kind": "Node", "name": args.Node}})
	if err != nil {
		return err
	}
	url := fmt.Sprintf("%s/api/v1/namespaces/%s/pods/%s/binding", f.server, args.PodNamespace, args.PodName)
	resp, err := f.client.Post(url, "application/json", bytes.NewReader(body))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if resp.StatusCode >= 300 {
		return fmt.Errorf("binding %s/%s to %s: %s %s", args.PodNamespace, args.PodName, args.Node, resp.Status, data)
	}
	return nil
}

// reset forgets every bound pod (the bench empties the namespace between rounds).
func (f *floor) reset(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	f.bound, f.binds = map[string]int{}, 0
	f.mu.Unlock()
	reply(w, map[string]string{})
}

// count answers how many pods it bound since the last /reset.
func (f *floor) count(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	binds := f.binds
	f.mu.Unlock()
	reply(w, map[string]int{"binds": binds})
}

func reply(w http.ResponseWriter, body any) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(body)
}
