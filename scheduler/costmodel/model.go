// Package costmodel predicts the step time, throughput and per-GPU memory of
// a decoder-only transformer trained with Megatron-style 3D parallelism
// (tensor × pipeline × data), and searches the space of parallel plans for
// the fastest one that fits.
//
// The package is pure: every answer is a function of its inputs, so the
// control plane, the trace simulator and `gpuctl plan` get the same numbers.
//
// References:
//   - D. Narayanan et al., "Efficient Large-Scale Language Model Training on
//     GPU Clusters Using Megatron-LM", SC'21 (FLOP counts, bubble, p2p).
//   - V. Korthikanti et al., "Reducing Activation Recomputation in Large
//     Transformer Models", 2022 (activation memory).
//   - S. Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training
//     Trillion Parameter Models", SC'20 (16 bytes per parameter, stages).
package costmodel

import (
	"cmp"
	"fmt"
	"slices"
	"sort"
	"strings"
)

// Model is the shape of a decoder-only transformer.
type Model struct {
	// Name is the preset or user label; it does not change any number.
	Name string `json:"name,omitempty"`
	// Layers is the number of transformer blocks.
	Layers int `json:"layers"`
	// Hidden is the model (embedding) width h.
	Hidden int `json:"hidden"`
	// Heads is the number of attention (query) heads a.
	Heads int `json:"heads"`
	// KVHeads is the number of key/value heads (grouped-query attention);
	// 0 means Heads (plain multi-head attention).
	KVHeads int `json:"kv_heads,omitempty"`
	// FFN is the MLP inner width; 0 means 4·Hidden.
	FFN int `json:"ffn,omitempty"`
	// SeqLen is the training sequence length s.
	SeqLen int `json:"seq_len"`
	// Vocab is the vocabulary size V.
	Vocab int `json:"vocab"`
	// GatedMLP marks a SwiGLU-style MLP with three FFN matrices instead of two.
	GatedMLP bool `json:"gated_mlp,omitempty"`
	// TiedEmbeddings shares the input embedding with the output projection.
	TiedEmbeddings bool `json:"tied_embeddings,omitempty"`
	// LearnedPositions adds a learned SeqLen×Hidden position table (GPT-2/3
	// style) instead of rotary embeddings, which have no parameters.
	LearnedPositions bool `json:"learned_positions,omitempty"`
	// Dropout marks a model trained with dropout (GPT-3 style): masks are
	// stored and applied after attention and the MLP. Llama-style models
	// train without.
	Dropout bool `json:"dropout,omitempty"`
}

// kvHeads returns the effective number of key/value heads.
func (m Model) kvHeads() int {
	if m.KVHeads == 0 {
		return m.Heads
	}
	return m.KVHeads
}

// ffn returns the effective MLP inner width.
func (m Model) ffn() int {
	if m.FFN == 0 {
		return 4 * m.Hidden
	}
	return m.FFN
}

// Validate reports the first impossible value in m.
func (m Model) Validate() error {
	switch {
	case m.Layers <= 0:
		return fmt.Errorf("model layers must be positive, got %d", m.Layers)
	case m.Hidden <= 0:
		return fmt.Errorf("model hidden size must be positive, got %d", m.Hidden)
	case m.Heads <= 0:
		return fmt.Errorf("model heads must be positive, got %d", m.Heads)
	case m.Hidden%m.Heads != 0:
		return fmt.Errorf("model hidden size %d is not divisible by %d heads", m.Hidden, m.Heads)
	case m.KVHeads < 0:
		return fmt.Errorf("model kv heads must not be negative, got %d", m.KVHeads)
	case m.Heads%m.kvHeads() != 0:
		return fmt.Errorf("model heads %d are not divisible by %d kv heads", m.Heads, m.kvHeads())
	case m.FFN < 0:
		return fmt.Errorf("model ffn size must not be negative, got %d", m.FFN)
	case m.SeqLen <= 0:
		return fmt.Errorf("model sequence length must be positive, got %d", m.SeqLen)
	case m.Vocab <= 0:
		return fmt.Errorf("model vocabulary size must be positive, got %d", m.Vocab)
	}
	return nil
}

// layerMatmulParams counts the weights of one block that take part in
// matrix multiplies: Q and output projections (h² each), K and V
// (h·kv_dim each) and the MLP (2 or 3 matrices of h·ffn).
func (m Model) layerMatmulParams() float64 {
	h := float64(m.Hidden)
	kvDim := float64(m.kvHeads()) * h / float64(m.Heads)
	attn := 2*h*h + 2*h*kvDim
	mats := 2.0
	if m.GatedMLP {
		mats = 3
	}
	return attn + mats*h*float64(m.ffn())
}

// LayerParams is the parameter count of one transformer block: matmul
// weights plus its two normalisation vectors (biases are left out; they are
// under 0.01% of a block at these widths).
func (m Model) LayerParams() float64 {
	return m.layerMatmulParams() + 2*float64(m.Hidden)
}

// EmbeddingParams counts the input embedding, the output projection when it
// is not tied, and learned positions.
func (m Model) EmbeddingParams() float64 {
	vh := float64(m.Vocab) * float64(m.Hidden)
	p := vh
	if !m.TiedEmbeddings {
		p += vh
	}
	if m.LearnedPositions {
		p += float64(m.SeqLen) * float64(m.Hidden)
	}
	return p
}

// Params is the total parameter count: blocks, embeddings and the final norm.
func (m Model) Params() float64 {
	return float64(m.Layers)*m.LayerParams() + m.EmbeddingParams() + float64(m.Hidden)
}

// flopsPerToken splits the forward FLOPs of one token into the parts that
// recomputation treats differently. Following Narayanan et al. (SC'21, §5.1):
// a block's matmuls cost 2 FLOPs per weight per token, attention scores and
// the attention-weighted values cost 2·s·h each (no causal halving, as in the
// paper), and the output logits cost 2·h·V.
type flopsPerToken struct {
	matmul float64 // all blocks' weight matmuls
	attn   float64 // all blocks' QKᵀ and AV
	logits float64
}

func (m Model) forwardFLOPsPerToken() flopsPerToken {
	l := float64(m.Layers)
	return flopsPerToken{
		matmul: l * 2 * m.layerMatmulParams(),
		attn:   l * 4 * float64(m.SeqLen) * float64(m.Hidden),
		logits: 2 * float64(m.Hidden) * float64(m.Vocab),
	}
}

// IterationFLOPs returns the FLOPs of one optimizer step over globalBatch
// sequences: model FLOPs (forward + backward = 3× forward) and hardware
// FLOPs (adding what recomputation repeats). For a GPT-3-shaped model
// (FFN = 4h, no GQA) model FLOPs equal the Megatron-LM formula
// 72·B·s·l·h²·(1 + s/(6h) + V/(12·l·h)) and full recomputation gives
// 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h)) — Narayanan et al., SC'21, eq. in §5.1.
func (m Model) IterationFLOPs(globalBatch int, r Recompute) (model, hardware float64) {
	f := m.forwardFLOPsPerToken()
	tokens := float64(globalBatch) * float64(m.SeqLen)
	model = 3 * tokens * (f.matmul + f.attn + f.logits)
	hardware = model
	switch r {
	case RecomputeFull:
		// The blocks' forward pass runs twice; the logits are not recomputed.
		hardware += tokens * (f.matmul + f.attn)
	case RecomputeSelective:
		// Only the attention core (scores, softmax, AV) is recomputed.
		hardware += tokens * f.attn
	}
	return model, hardware
}

// preset is a published model shape with the global batch it was trained
// with, and the ZeRO stage where the publication used another than 1.
type preset struct {
	model Model
	batch int
	zero  int
}

// presets hold published shapes. The parameter counts in the notes are what
// Params computes; model_test.go checks them against the published sizes.
var presets = map[string]preset{
	"gpt3-175b": {
		// Brown et al. 2020, Table 2.1; batch 1536 as in Narayanan et al. Table 1.
		// Params() = 174.6e9 (published 175B).
		model: Model{Name: "gpt3-175b", Layers: 96, Hidden: 12288, Heads: 96, SeqLen: 2048, Vocab: 50257,
			TiedEmbeddings: true, LearnedPositions: true, Dropout: true},
		batch: 1536,
	},
	"llama2-70b": {
		// Touvron et al. 2023: GQA with 8 kv heads, SwiGLU FFN 28672, 4M-token batches.
		// Params() = 68.98e9 (published 70B; 68.98B by count).
		model: Model{Name: "llama2-70b", Layers: 80, Hidden: 8192, Heads: 64, KVHeads: 8, FFN: 28672,
			SeqLen: 4096, Vocab: 32000, GatedMLP: true},
		batch: 1024,
	},
	"llama3-405b": {
		// Llama 3 Herd of Models 2024, Table 3; 16M-token batches at 8K context.
		// Params() = 405.85e9 (published 405B).
		model: Model{Name: "llama3-405b", Layers: 126, Hidden: 16384, Heads: 128, KVHeads: 8, FFN: 53248,
			SeqLen: 8192, Vocab: 128256, GatedMLP: true},
		batch: 2048,
		// §3.3.2: FSDP shards optimizer state and gradients, not the
		// parameters after the forward pass: ZeRO-2's memory.
		zero: 2,
	},
	"gpt-1t": {
		// Narayanan et al. SC'21, Table 1 (last row): 128 layers, h 25600, 160 heads, batch 3072.
		// Params() = 1008.0e9 (published 1008B).
		model: Model{Name: "gpt-1t", Layers: 128, Hidden: 25600, Heads: 160, SeqLen: 2048, Vocab: 51200,
			TiedEmbeddings: true, LearnedPositions: true, Dropout: true},
		batch: 3072,
	},
}

// ModelNames lists the model presets, sorted.
func ModelNames() []string {
	names := make([]string, 0, len(presets))
	for n := range presets {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// LookupModel returns a preset's shape and the training setup it was
// published with (global batch, bf16, selective recomputation, sequence
// parallelism, ZeRO stage 1 — Megatron's distributed optimizer — unless the
// publication says another).
func LookupModel(name string) (Model, Training, error) {
	p, ok := presets[strings.ToLower(strings.TrimSpace(name))]
	if !ok {
		return Model{}, Training{}, fmt.Errorf("unknown model preset %q: use one of %s, or give layers/hidden/heads/seq_len/vocab",
			name, strings.Join(ModelNames(), ", "))
	}
	return p.model, Training{
		GlobalBatch:      p.batch,
		Precision:        PrecisionBF16,
		ZeROStage:        cmp.Or(p.zero, 1),
		Recompute:        RecomputeSelective,
		SequenceParallel: true,
	}, nil
}

// divisors returns the positive divisors of n in ascending order.
func divisors(n int) []int {
	var lo, hi []int
	for i := 1; i*i <= n; i++ {
		if n%i == 0 {
			lo = append(lo, i)
			if i != n/i {
				hi = append(hi, n/i)
			}
		}
	}
	slices.Reverse(hi)
	return append(lo, hi...)
}
