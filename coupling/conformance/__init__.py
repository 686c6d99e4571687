r"""Conformance checks for speculative-decoding verifiers: is their output the target's law?

A verifier is lossless when iterating it (draft, verify, append, repeat) generates text
with exactly the target model's law. Engines usually test one position with
context-free laws (a chi-square per position, a KL threshold) or greedy equality; a
verifier can pass those and still be wrong over sequences. This package checks whole
generation loops on context-dependent models, against the target's exact law.

Protocol
--------
``verify(drafts, p, q, rng) -> emitted``: ``drafts`` int ``[k, gamma]`` (``k`` branches of
``gamma`` drafts, drawn from ``q``; i.i.d. or with distinct first tokens), ``p`` float
``[k, gamma + 1, V]`` (target laws along each branch, then the bonus law), ``q`` float
``[k, gamma, V]``, ``rng`` a ``numpy.random.Generator``; ``emitted`` is the accepted drafts
of the chosen branch followed by one token. Batched torch verifiers plug in through
:func:`from_torch`; this package's rules through :func:`from_rule`.

Exact mode: a verifier that also exposes ``verify.law(drafts, p, q) -> {emitted tuple:
probability}`` (the conditional law of its emission given the drafts; the rules of this
package do, from their exact joints) is checked by enumeration: TV to the target exact.

What runs
---------
:func:`check_verifier` builds six context-dependent model pairs from ``seed``
(:func:`model_pairs`: generic, near-deterministic, high-entropy, zeros in ``q`` where
``p > 0`` and the reverse, draft = target), runs ``draws`` generation loops on each, and
compares the law of the first ``length`` tokens with :func:`coupling.target_law` by a
multinomial likelihood-ratio test with rare strings pooled (:mod:`.stats`), Bonferroni over
the pairs at false-positive rate ``alpha``. The report gives the p-value, the worst pair's
TV with a 95% interval, and the smallest TV the test detects with 90% power. By default each
step drafts 1 to 4 tokens and the tokens sit at ids of a 16-id vocabulary (:mod:`.ids`);
:func:`from_torch` hands batched verifiers float32 laws, ragged padded batches
(``ragged=True``) and greedy rows beside sampled ones (``greedy=True``); :mod:`.padded` is an
engine-style verifier of such batches with two controls.

:mod:`.bugs` reproduces three published verification bugs (vLLM, vllm-ascend, Hugging Face
transformers) with exact laws, and their fixes; :mod:`.museum` adds more shipped bugs and
two published "bugs" that are not, all listed by :func:`known_bugs` with the verdict the
checker must reach; :func:`probe_boundaries` (:mod:`.probes`) feeds a verifier uniforms at
their boundaries, where bugs of probability 0 under the law hide; and
:func:`minimal_counterexample` (:mod:`.minimal`) finds a failing verifier's smallest failing
case, with the strings that are off and a script that reproduces it.

Loop mode, :func:`check_generation` (:mod:`.generation`): the code under test drafts by
itself (a whole speculative generation loop, handed the two models as logits and a
generator), optionally with the engine's own logit processing, and the law of what it
generates is tested against the (processed) target's. :func:`check_tree_verifier`
(:mod:`.trees`) runs a verifier of a static draft tree of any shape through that loop.
"""

from .adapters import from_torch, hf_assisted_generation, hf_speculative_sampling, torch_rule
from .bugs import REPRODUCTIONS
from .check import DRAWS, ConformanceReport, PairResult, VerifierRaised, check_verifier
from .generation import GenerationRaised, check_generation
from .minimal import Counterexample, minimal_counterexample
from .museum import Exhibit, known_bugs
from .pairs import PAIR_NAMES, Pair, model_pairs
from .probes import ProbeReport, probe_boundaries
from .trees import check_tree_verifier, from_tree_rule
from .verifiers import chain_law, from_rule

__all__ = [
    "check_verifier",
    "check_generation",
    "GenerationRaised",
    "check_tree_verifier",
    "from_tree_rule",
    "minimal_counterexample",
    "Counterexample",
    "ConformanceReport",
    "PairResult",
    "VerifierRaised",
    "DRAWS",
    "from_rule",
    "from_torch",
    "torch_rule",
    "hf_speculative_sampling",
    "hf_assisted_generation",
    "chain_law",
    "model_pairs",
    "Pair",
    "PAIR_NAMES",
    "REPRODUCTIONS",
    "Exhibit",
    "known_bugs",
    "probe_boundaries",
    "ProbeReport",
]
