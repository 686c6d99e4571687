#!/usr/bin/env python
"""Train the 1-layer SmolLM2 draft by distillation (coupling/data/draft_smollm2.safetensors).

Method
------
1. Corpus: the target (SmolLM2-135M-Instruct, bf16, CPU) answers varied chat prompts built from
   the templates below (disjoint from the demo's prompts in ``coupling/data/prompts.json``),
   sampling at temperature 1 in batches. At every generated position we store the target's
   top-``K`` next-token log-probabilities (the full softmax, restricted to its top K entries).
2. Distillation: the draft is a ``LlamaForCausalLM`` with one decoder layer (initialised from
   target layer 0) that *shares* the target's embeddings, final norm and LM head (frozen); only
   its layer is trained. The loss is the forward KL between the target and the draft after
   coarsening the vocabulary to the target's top-K tokens plus one "tail" bucket:

       L = - sum_{i in topK} p_i log q_i  - (1 - sum_{topK} p) log(1 - sum_{topK} q)   (+ const)

   which is an exact KL of the coarsened laws (so it never rewards mass leaking into the tail).
3. Report: mean sum_x min(p, q) on held-out positions at temperature 1, before and after.

Only the draft's own tensors (one decoder layer, ~7 MB in bf16) are written.

Usage: ``python scripts/train_draft.py [--minutes-train 8] [--n-prompts 192] [--new-tokens 160]``
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path

import torch

from coupling.llm import drafts, models

TOPICS = [
    "photosynthesis", "the French Revolution", "black holes", "machine learning", "the water cycle",
    "volcanoes", "the Roman Empire", "climate change", "the human immune system", "jazz music",
    "the stock market", "quantum computing", "honey bees", "the printing press", "electric cars",
    "the Great Wall of China", "sleep", "coffee", "chess", "the Internet", "vaccines", "recycling",
    "the Moon landing", "dinosaurs", "renewable energy", "the Olympic Games", "cryptography",
    "ancient Egypt", "plate tectonics", "friendship", "public libraries", "bicycles", "tea",
]
TEMPLATES = [
    "Write a detailed essay about {t}.",
    "Explain {t} to a ten-year-old.",
    "Write a short story that involves {t}.",
    "List ten interesting facts about {t}, with a sentence of explanation each.",
    "What are the main arguments for and against {t}? Answer in several paragraphs.",
    "Write a blog post introducing {t} to beginners.",
    "Describe the history of {t} step by step.",
    "Write a poem about {t}, then explain its imagery.",
]
CODE_PROMPTS = [
    "Write a Python function that {t}, with comments and a usage example.",
]
CODE_TASKS = [
    "reverses a linked list", "computes prime numbers up to n", "parses a CSV file",
    "implements binary search", "counts word frequencies in a text", "merges two sorted lists",
    "validates an email address", "computes the Fibonacci sequence with memoization",
]


# Everyday chat requests of many kinds, for a draft that must generalise to unseen requests:
# (template, slot values). They share request kinds with the demo prompts
# (coupling/data/prompts.json: recipes, emails, advice, explanations, stories, code) but no
# prompt and no subject; diverse_prompts checks the prompts. One template wording shares an
# opening: "Summarize the causes of the Great Depression." opens like the demo's "Summarize
# the causes of the First World War." (kept: the shipped feature draft is trained on it;
# tests/test_drafts.py pins that it is the only one).
CHAT_KINDS = [
    ("How do I make {t}? Give the ingredients and the method.", [
        "banana bread", "a tomato pasta sauce", "pancakes", "a lentil curry", "guacamole",
        "fried rice", "an apple pie", "hummus", "a chicken stir-fry", "oatmeal cookies"]),
    ("Write a polite email to {t}.", [
        "my landlord about a broken heater", "a colleague asking to swap shifts",
        "a teacher about my child's absence", "a client to reschedule a meeting",
        "a shop asking for a refund", "my team announcing a new project",
        "a professor asking for a recommendation letter", "a friend I have not seen in years"]),
    ("What matters most when {t}?", [
        "adopting a dog", "renting my first apartment", "choosing a university",
        "starting a small business", "planning a trip abroad", "buying a used car",
        "changing careers", "picking a running shoe"]),
    ("What are your best tips for {t}?", [
        "sleeping better", "saving money on groceries", "learning to cook",
        "public speaking", "keeping houseplants alive", "writing a CV",
        "running a first marathon", "working from home", "making new friends in a new city"]),
    ("What is the difference between {t}?", [
        "a virus and a bacterium", "stocks and bonds", "RAM and storage",
        "a simile and a metaphor", "baking soda and baking powder", "speed and velocity",
        "an alligator and a crocodile", "a democracy and a republic"]),
    ("Why {t}?", [
        "do leaves change colour in autumn", "does ice float", "do we have seasons",
        "do cats purr", "does bread rise", "do onions make us cry", "is the ocean salty",
        "do we dream"]),
    ("How does {t} work?", [
        "a microwave oven", "GPS", "a vaccine", "an electric motor", "a credit card",
        "the heart", "a solar panel", "a search engine", "a bicycle gear", "compound interest"]),
    ("Summarize {t}.", [
        "the plot of Romeo and Juliet", "the causes of the Great Depression",
        "the theory of evolution", "the history of the bicycle", "how the Internet began",
        "the main ideas of stoicism", "the Industrial Revolution", "the story of the Odyssey"]),
    ("Tell me a short story about {t}.", [
        "a robot learning to paint", "a girl who can talk to birds", "a lost umbrella",
        "two rival bakers", "a time traveller stuck in 1850", "a dragon afraid of fire",
        "a detective cat", "a village without clocks"]),
    ("Write a poem about {t}.", [
        "the first snow", "an old train station", "morning coffee", "the sea at night",
        "a grandmother's garden", "city lights"]),
    ("Walk me through {t}.", [
        "the water cycle", "how a bill becomes a law", "the life of a honey bee",
        "a typical day of an astronaut", "how glass is made", "the phases of the Moon",
        "how a volcano erupts", "the rules of chess"]),
    ("What are the pros and cons of {t}?", [
        "electric cars", "remote work", "social media", "nuclear power", "homeschooling",
        "living in a big city", "credit cards", "a four-day work week"]),
    ("Show me Python code that {t}, with a short explanation.", [
        "reverses the words in a sentence", "finds the largest number in a list",
        "counts vowels in a string", "checks whether a number is prime",
        "removes duplicates from a list", "converts Celsius to Fahrenheit",
        "sorts a list of dictionaries by a key", "flattens a nested list",
        "computes the factorial of n", "merges two dictionaries"]),
    ("Help me plan {t}.", [
        "a birthday party for a seven-year-old", "a weekend in Rome", "a weekly workout routine",
        "a vegetable garden", "a study schedule for exams", "a budget for a wedding"]),
    ("Write a product description for {t}.", [
        "a waterproof hiking backpack", "a smart coffee mug", "noise-cancelling headphones",
        "a bamboo cutting board", "a solar-powered lamp", "a children's picture book"]),
    ("Suggest five names for {t}, and say why each works.", [
        "a bakery", "a podcast about history", "a hiking club", "a mobile game about space",
        "a golden retriever puppy", "a vegan restaurant"]),
    ("What happened during {t}?", [
        "the Apollo 13 mission", "the fall of the Berlin Wall", "the California Gold Rush",
        "the Renaissance", "the Boston Tea Party", "the Black Death"]),
    ("Rewrite this sentence so it sounds more professional: \"{t}\"", [
        "hey, the report is gonna be late again", "we messed up the order, sorry",
        "can u send me the files asap", "this idea is kind of bad honestly",
        "I need a day off cause I'm tired", "the meeting was a total waste of time"]),
    ("Write a short motivational message for {t}.", [
        "a friend starting a new job", "students before an exam", "a team that lost a match",
        "someone learning to swim as an adult", "a nurse after a long shift",
        "a runner before a race"]),
    ("Give me advice on {t}.", [
        "negotiating a salary", "dealing with a difficult coworker", "learning the guitar",
        "reducing stress", "teaching a child to read", "writing a good essay"]),
]


# A second, disjoint set of request kinds: no template, prompt or 4-word opening in common
# with the demo prompts (tests/test_drafts.py checks it).
CHAT_KINDS_2 = [
    ("Describe {t} to someone who has never seen it.", [
        "snow", "the ocean", "a rainforest", "a desert at night", "a busy train station",
        "the Northern Lights", "a thunderstorm", "a coral reef"]),
    ("Explain {t} to a ten-year-old.", [
        "photosynthesis", "gravity", "how money works", "what a computer program is",
        "why we need sleep", "how airplanes fly", "what DNA is", "how the Moon causes tides"]),
    ("Compare {t} and tell me which you would choose.", [
        "tea and coffee", "trains and planes for a 500 km trip", "renting and buying a home",
        "paper books and e-readers", "a gym membership and home workouts",
        "cats and dogs as pets", "public transport and cycling to work",
        "a gas stove and an induction hob"]),
    ("Write a haiku about {t}.", [
        "autumn leaves", "a sleepy cat", "rain on a window", "the last train home",
        "a mountain lake", "fresh bread", "a full moon", "the first day of spring"]),
    ("Write a thank-you note to {t}.", [
        "a neighbour who watered my plants", "a mentor who helped me find a job",
        "my grandparents for a birthday gift", "a nurse who cared for my father",
        "a bus driver who found my wallet", "a coach at the end of the season"]),
    ("What is {t}, and why does it matter?", [
        "inflation", "biodiversity", "the ozone layer", "a credit score", "net neutrality",
        "herd immunity", "the placebo effect", "supply and demand"]),
    ("Give me a step-by-step guide to {t}.", [
        "changing a flat tyre", "setting up a home Wi-Fi network", "planting tomatoes",
        "ironing a shirt", "making a paper airplane", "cleaning a cast-iron pan", "tying a tie",
        "repotting a plant"]),
    ("Write a JavaScript function that {t}, and explain how it works.", [
        "capitalises every word in a string", "returns the sum of an array",
        "checks if two strings are anagrams", "shuffles an array",
        "counts the characters in a string", "debounces another function"]),
    ("Write a SQL query that {t}.", [
        "finds the ten best-selling products", "counts orders per customer",
        "lists employees hired this year", "finds duplicate email addresses",
        "computes the average salary by department", "joins orders with customers"]),
    ("Tell me three interesting facts about {t}.", [
        "octopuses", "the planet Mars", "honey", "the Great Wall of China", "penguins",
        "the human brain", "the Amazon river", "bamboo"]),
    ("I feel {t}. What can I do?", [
        "nervous before job interviews", "lonely after moving to a new town",
        "overwhelmed by my to-do list", "bored at work", "tired every afternoon",
        "stuck on my novel"]),
    ("Write a bedtime story about {t}.", [
        "a sleepy bear", "a star that fell into a garden", "a brave little boat",
        "a mouse who wanted to fly", "a moon that lost its glow", "a kind giant"]),
    ("Create a {t}.", [
        "quiz with five questions about the solar system",
        "shopping list for a week of healthy dinners", "packing list for a camping trip",
        "morning routine for a busy parent", "checklist for moving house",
        "reading list for someone new to science fiction"]),
    ("What would happen if {t}?", [
        "the Moon disappeared", "everyone stopped driving cars for a year",
        "humans could breathe underwater", "the Internet went down for a week",
        "bees went extinct", "the Earth stopped spinning"]),
    ("Write a short speech for {t}.", [
        "a best friend's wedding", "a school graduation", "a retirement party",
        "the opening of a library", "a charity fundraiser", "an award ceremony"]),
    ("How can I improve {t}?", [
        "my handwriting", "my memory", "my posture at the desk", "my chess game",
        "my photography", "my cooking skills"]),
    ("Write a review of {t}.", [
        "a cosy Italian restaurant", "a new smartphone", "a long train journey",
        "a science museum", "a mystery novel", "a budget hotel"]),
    ("Write a dialogue between {t}.", [
        "a customer and a barista", "a teacher and a curious student",
        "two astronauts on Mars", "a detective and a suspect",
        "a grandparent and a grandchild", "a chef and a food critic"]),
    ("Outline an essay about {t}.", [
        "the importance of sleep", "climate change and farming",
        "the history of the printing press", "why art matters", "the future of space travel",
        "the role of libraries"]),
    ("What are common mistakes when {t}, and how do I avoid them?", [
        "learning to drive", "baking bread", "writing a cover letter", "starting to run",
        "painting a room", "taking photos with a phone"]),
    ("Describe a typical day in the life of {t}.", [
        "a farmer", "a zookeeper", "a firefighter", "a Roman soldier", "a medieval baker",
        "a marine biologist"]),
]

# A third set: 22 more kinds, again sharing no template, prompt or 4-word opening with the
# demo prompts or the first two sets (tests/test_drafts.py pins it).
CHAT_KINDS_3 = [
    ("Can you explain how {t} works, in plain words?", [
        "a vaccine", "a solar panel", "a microwave oven", "a bicycle gear", "an electric car",
        "a search engine", "a heat pump", "a touchscreen"]),
    ("Write a Rust function that {t}, with comments.", [
        "reverses a vector", "counts the vowels in a string", "finds the largest number in a slice",
        "checks whether a year is a leap year", "parses a comma-separated line",
        "computes a factorial"]),
    ("Write a bash script that {t}.", [
        "backs up a folder every night", "renames all .txt files to .md",
        "counts the lines in every file of a directory", "checks whether a website is up",
        "deletes files older than thirty days", "prints the ten largest files"]),
    ("Solve this step by step: {t}", [
        "a train travels 180 km in 2 hours; what is its average speed?",
        "what is 15% of 240?", "if 3 pencils cost 45 cents, how much do 7 cost?",
        "a rectangle is 8 m by 5 m; what is its area and perimeter?",
        "what is the next number in 2, 6, 12, 20, 30?",
        "how many minutes are there in a week?"]),
    ("I am a beginner at {t}. Where should I start?", [
        "gardening", "playing the guitar", "investing", "drawing", "swimming", "yoga",
        "photography", "learning Japanese"]),
    ("Draft a message to {t}.", [
        "my landlord about a broken heater", "a colleague who covered my shift",
        "a teacher asking about my child's progress", "a friend I have not seen in years",
        "customer support about a late delivery", "my team announcing a new project"]),
    ("Who was {t}, and what is remembered about them?", [
        "Marie Curie", "Leonardo da Vinci", "Nelson Mandela", "Ada Lovelace", "Genghis Khan",
        "Isaac Newton", "Frida Kahlo", "Alan Turing"]),
    ("Argue for and against {t}.", [
        "a four-day working week", "school uniforms", "banning cars from city centres",
        "homework for young children", "nuclear power", "universal basic income"]),
    ("Make up a riddle about {t}, and give the answer.", [
        "a clock", "a shadow", "an egg", "a candle", "a river", "a keyboard"]),
    ("How should I prepare for {t}?", [
        "a long hike", "a job interview at a bank", "my first marathon", "a winter storm",
        "a public speaking event", "a trip abroad"]),
    ("Translate the idea of {t} into simple English.", [
        "opportunity cost", "compound interest", "natural selection", "entropy",
        "machine learning", "the greenhouse effect"]),
    ("Plan a three-day itinerary for {t}.", [
        "Rome", "Kyoto", "a national park", "a beach holiday", "Paris with children",
        "a city break in Lisbon"]),
    ("What questions should I ask {t}?", [
        "a doctor about a new medication", "a landlord before renting", "a used car seller",
        "an interviewer at the end of an interview", "a wedding photographer",
        "a financial adviser"]),
    ("Write a limerick about {t}.", [
        "a forgetful wizard", "a cat who loves boxes", "a rainy Monday", "a clumsy robot",
        "a hungry goat", "a pirate who hates the sea"]),
    ("Explain why {t}.", [
        "leaves change colour in autumn", "bread rises", "ice floats on water",
        "we have leap years", "the sea is salty", "cats purr", "onions make us cry",
        "metal feels colder than wood"]),
    ("Turn these notes into a paragraph: {t}", [
        "meeting moved to Friday, budget approved, need two volunteers",
        "park cleanup Saturday 9am, bring gloves, snacks provided",
        "new library hours, open Sundays, free Wi-Fi",
        "team won the match 3-1, next game away, bus leaves at 8",
        "office closed Monday, heating repairs, work from home"]),
    ("Write the opening paragraph of {t}.", [
        "a mystery novel set on a train", "a science fiction story on a generation ship",
        "a fairy tale about a clockmaker", "a memoir about growing up by the sea",
        "a travel article about Iceland", "a news report about a lost dog found"]),
    ("What is the best way to {t}?", [
        "learn vocabulary in a new language", "save money on groceries",
        "keep houseplants alive", "organise a small kitchen", "fall asleep faster",
        "remember people's names"]),
    ("Design a simple {t}.", [
        "weekly workout plan", "budget for a student", "board game for two players",
        "lesson plan about volcanoes", "morning stretching routine", "menu for a picnic"]),
    ("Give an example of {t}, and explain it.", [
        "a metaphor", "a logical fallacy", "a renewable resource", "a food chain",
        "an irregular verb", "a chemical reaction at home"]),
    ("Correct the grammar in this sentence: \"{t}\"", [
        "me and him goes to the store yesterday", "their going to be late again",
        "she don't like apples", "the dog wagged it's tail", "I could of helped you",
        "everyone have their own opinion"]),
    ("In a few sentences, what is {t}?", [
        "the water cycle", "a black hole", "democracy", "the stock market", "an ecosystem",
        "the Renaissance", "a neural network", "plate tectonics"]),
]

CHAT_KINDS_4 = [
    ("What is the history of {t}?", [
        "the bicycle", "chess", "the printing press", "coffee", "the Olympic Games",
        "paper money", "the telephone"]),
    ("Give me a packing list for {t}.", [
        "a weekend camping trip", "a beach holiday", "a business trip", "a ski week",
        "a music festival", "a long flight"]),
    ("Write a C function that {t}, and explain the tricky parts.", [
        "reverses a linked list", "counts the bits set in an integer", "copies a string safely",
        "finds the largest element of an array", "swaps two integers without a temporary",
        "parses a decimal number from a string"]),
    ("How do I fix {t}?", [
        "a leaking tap", "a slow computer", "a squeaky door", "a flat bicycle tyre",
        "a phone that will not charge", "a wobbly table", "a clogged sink"]),
    ("What are the main ideas of {t}?", [
        "stoicism", "supply and demand", "the theory of evolution", "minimalism",
        "utilitarianism", "the scientific method"]),
    ("Write a cover letter for {t}.", [
        "a barista job", "a junior software developer position", "a summer internship",
        "a library assistant role", "a nursing position", "a volunteer at an animal shelter"]),
    ("Explain the rules of {t}.", [
        "basketball", "poker", "tennis", "cricket", "checkers", "volleyball", "sudoku"]),
    ("What are healthy alternatives to {t}?", [
        "sugary drinks", "potato chips", "white bread", "fried food", "candy",
        "late-night snacking"]),
    ("Write a short mystery story set in {t}.", [
        "a train station", "an old library", "a small fishing village", "a museum at night",
        "a snowed-in hotel", "a school science lab"]),
    ("How can a small business {t}?", [
        "find its first customers", "use social media", "keep its records in order",
        "price its products", "hire its first employee", "handle a bad review"]),
    ("Describe the geography and climate of {t}.", [
        "Iceland", "Kenya", "New Zealand", "Canada", "Chile", "Japan", "Egypt"]),
    ("What are some fun activities for {t}?", [
        "a rainy day at home", "a family reunion", "a child's birthday party",
        "a team-building day", "a quiet Sunday", "a group of teenagers"]),
    ("Teach me the basics of {t}.", [
        "personal finance", "photography", "knitting", "public speaking",
        "first aid", "touch typing", "gardening"]),
    ("Write a Java method that {t}, and explain it.", [
        "checks whether a number is prime", "counts the words in a sentence",
        "returns the factorial of n", "merges two sorted arrays", "removes duplicates from a list",
        "converts Celsius to Fahrenheit"]),
    ("Write a short apology to {t}.", [
        "a friend for missing their birthday", "a customer for a late delivery",
        "my team for a missed deadline", "a neighbour for a noisy party",
        "a teacher for a late assignment", "my sister for borrowing her car"]),
    ("How is {t} made?", [
        "glass", "cheese", "chocolate", "paper", "steel", "bread", "a pencil"]),
    ("Give me a weekly meal plan for {t}.", [
        "a vegetarian", "a busy parent", "a student on a budget", "someone training for a marathon",
        "a family of four", "someone who cannot cook"]),
    ("What are the symptoms of {t}, and when should someone see a doctor?", [
        "dehydration", "the flu", "burnout", "a sprained ankle", "food poisoning",
        "seasonal allergies"]),
    ("Write the lyrics of a short song about {t}.", [
        "a road trip", "the first snow", "an old friend", "a lazy cat", "city lights",
        "the end of summer"]),
    ("Explain what {t} means in programming, with an example.", [
        "recursion", "a closure", "an API", "a race condition", "immutability",
        "a hash table", "garbage collection"]),
    ("How do I talk to {t}?", [
        "my boss about a raise", "a child about money", "a friend who is grieving",
        "a landlord about repairs", "a coworker who interrupts me", "my parents about my career"]),
    ("Write a news headline and a short article about {t}.", [
        "a new park opening in town", "a local team winning a championship",
        "a library extending its hours", "a heat wave", "a school science fair",
        "a new bus route"]),
]

PROMPT_SETS = {"diverse": CHAT_KINDS, "diverse2": CHAT_KINDS_2, "diverse3": CHAT_KINDS_3,
               "diverse4": CHAT_KINDS_4}


def diverse_prompts(n: int, seed: int, kinds: list | None = None) -> list[str]:
    """``n`` chat requests from ``kinds`` (default :data:`CHAT_KINDS`), shuffled, each distinct
    prompt used as evenly as possible (the templated pool of :func:`corpus_prompts` is a
    separate corpus)."""
    demo = json.loads((models.DATA_DIR / "prompts.json").read_text())["prompts"]
    pool = [tpl.format(t=t) for tpl, vals in (kinds or CHAT_KINDS) for t in vals]
    clash = [p for p in pool if p in demo]
    if clash:
        raise ValueError(f"training prompts equal demo prompts: {clash}")
    rng = random.Random(seed)
    rng.shuffle(pool)
    return [pool[i % len(pool)] for i in range(n)]


def corpus_prompts(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    pool = [tpl.format(t=t) for tpl in TEMPLATES for t in TOPICS]
    pool += [tpl.format(t=t) for tpl in CODE_PROMPTS for t in CODE_TASKS]
    rng.shuffle(pool)
    # More prompts than templates: cycle, so each prompt gets several independent samples.
    return [pool[i % len(pool)] for i in range(n)]


@torch.no_grad()
def generate_corpus(target, tok, prompts, new_tokens, batch, top_k, seed, *,
                    temperature=1.0, sample_top_k=0, sample_top_p=1.0):
    """Sample continuations; return per-sequence (ids, n_prompt, topk_idx, topk_logp).

    Continuations are sampled with (temperature, sample_top_k, sample_top_p); the stored
    log-probabilities are always the target's raw (temperature 1, untruncated) law.
    """
    from tqdm import tqdm

    tok.padding_side = "left"
    torch.manual_seed(seed)
    out = []
    for b in tqdm(range(0, len(prompts), batch), desc="corpus"):
        texts = [tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                         add_generation_prompt=True) for p in prompts[b:b + batch]]
        enc = tok(texts, return_tensors="pt", padding=True)
        g = target.generate(**enc, do_sample=True, temperature=temperature,
                            top_k=sample_top_k, top_p=sample_top_p,
                            max_new_tokens=new_tokens, return_dict_in_generate=True,
                            output_logits=True, pad_token_id=tok.pad_token_id)
        logits = torch.stack(g.logits, 1).float()                # [B, T, V] raw target logits
        logp = torch.log_softmax(logits, -1)
        vals, idx = logp.topk(top_k, -1)
        seqs = g.sequences[:, enc.input_ids.shape[1]:]
        for i in range(seqs.shape[0]):
            n_pad = int((enc.attention_mask[i] == 0).sum())
            prompt_ids = enc.input_ids[i, n_pad:]
            gen = seqs[i]
            stop = (gen == tok.eos_token_id).nonzero()
            n_gen = int(stop[0]) + 1 if len(stop) else gen.shape[0]
            out.append(dict(ids=torch.cat([prompt_ids, gen[:n_gen]]), n_prompt=len(prompt_ids),
                            idx=idx[i, :n_gen].to(torch.int32), logp=vals[i, :n_gen].half()))
    return out


def head_ranking(data, vocab_size: int, n: int = 16384) -> torch.Tensor:
    """Tokens ranked by total target probability over the corpus positions (top-K rows).

    Used to restrict the draft's LM head to the tokens that carry the target's mass
    (:class:`coupling.llm.heads.SubsetHead`); the first ``n`` are kept.
    """
    mass = torch.zeros(vocab_size, dtype=torch.float64)
    for s in data:
        mass.index_add_(0, s["idx"].long().flatten(), s["logp"].double().exp().flatten())
    # tokens never seen keep mass 0 and rank last (ties broken by token id: deterministic)
    return torch.argsort(-mass, stable=True)[:n].to(torch.int32)


def coverage(data, ranking: torch.Tensor, n: int) -> float:
    """Mean target mass inside the first n ranked tokens (over corpus positions)."""
    keep = torch.zeros(int(ranking.max()) + 1 + 49152, dtype=torch.bool)
    keep[ranking[:n].long()] = True
    tot, cnt = 0.0, 0
    for s in data:
        p = s["logp"].double().exp()
        tot += (p * keep[s["idx"].long()]).sum().item()
        cnt += p.shape[0]
    return tot / cnt


def coarse_kl_loss(draft_logits, idx, logp_t, mask):
    """KL(p || q) on the coarsened vocabulary {top-K of p} + {tail}, averaged over mask."""
    logq = torch.log_softmax(draft_logits.float(), -1)
    p = logp_t.float().exp()                                       # [N, K]
    lq = logq.gather(-1, idx.long())                               # [N, K]
    p_tail = (1 - p.sum(-1)).clamp_min(0)
    q_tail = (1 - lq.exp().sum(-1)).clamp_min(1e-9)
    ce = -(p * lq).sum(-1) - p_tail * q_tail.log()
    return (ce * mask).sum() / mask.sum()


@torch.no_grad()
def agreement(draft, data, max_seq=24):
    """Mean sum_x min(p_x, q_x) over stored positions, temperature 1.

    p is known on its top K only, so this is a lower bound of the full-vocabulary overlap.
    """
    tot, n = 0.0, 0
    for s in data[:max_seq]:
        ids = s["ids"][None]
        logits = draft(ids).logits[0, s["n_prompt"] - 1:-1].float()
        q = torch.softmax(logits, -1)
        p = s["logp"].float().exp()
        qk = q.gather(-1, s["idx"].long())
        tot += torch.minimum(p, qk).sum().item()
        n += qk.shape[0]
    return tot / max(n, 1)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n-prompts", type=int, default=208)
    ap.add_argument("--new-tokens", type=int, default=160)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--top-k", type=int, default=64)
    ap.add_argument("--minutes-train", type=float, default=7.0)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seq-per-step", type=int, default=4)
    ap.add_argument("--init-layer", type=int, default=None,
                    help="target layer copied into the trained layer (default: shared-layers)")
    ap.add_argument("--shared-layers", type=int, default=0,
                    help="share the target's first N layers (frozen, not stored) below it")
    ap.add_argument("--resume", type=Path, default=None, help="start from these draft weights")
    ap.add_argument("--rank-only", action="store_true",
                    help="with --resume: only add the head-token ranking and re-save")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (1 avoids OpenMP stalls on a loaded shared machine)")
    ap.add_argument("--corpus", type=Path, default=models.cache_dir() / "draft_corpus.pt",
                    help="cached corpus (regenerated if missing)")
    ap.add_argument("--out", type=Path, default=drafts.DRAFT_WEIGHTS)
    args = ap.parse_args(argv)

    t_start = time.perf_counter()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    target = models.load_target("bfloat16")
    tok = models.load_tokenizer()
    if args.corpus.is_file():
        data = torch.load(args.corpus)
        print(f"loaded corpus {args.corpus}: {len(data)} sequences")
    else:
        t0 = time.perf_counter()
        data = generate_corpus(target, tok, corpus_prompts(args.n_prompts, args.seed),
                               args.new_tokens, args.batch, args.top_k, args.seed)
        args.corpus.parent.mkdir(parents=True, exist_ok=True)
        torch.save(data, args.corpus)
        print(f"corpus: {len(data)} sequences in {time.perf_counter() - t0:.0f} s")
    n_tok = sum(int(s["idx"].shape[0]) for s in data)
    print(f"corpus: {n_tok} target positions")
    ranking = head_ranking(data, target.config.vocab_size)
    for n in (4096, 8192, 16384):
        print(f"head subset {n}: mean target mass covered {coverage(data, ranking, n):.4f}")
    rng = random.Random(args.seed)
    rng.shuffle(data)
    held, train = data[:16], data[16:]
    if args.rank_only:
        if args.resume is None:
            raise ValueError("--rank-only needs --resume PATH")
        draft = drafts.load_draft(target, args.resume, logit_scale=1.0)
        from safetensors import safe_open

        with safe_open(str(args.resume), framework="pt") as f:
            meta = {k: v for k, v in f.metadata().items() if k != "spec"}
        meta["shared_layers"] = draft.coupling_spec.shared_layers
        drafts.save_draft(draft, draft.coupling_spec, args.out, meta, head_tokens=ranking)
        print(f"wrote {args.out} with head ranking")
        return 0

    n_shared = args.shared_layers
    init = n_shared if args.init_layer is None else args.init_layer
    if args.resume is not None:
        # trained uncalibrated: retraining invalidates a calibrated scale (calibrate_draft.py)
        draft = drafts.load_draft(target, args.resume, logit_scale=1.0)
        spec = draft.coupling_spec
        n_shared = spec.shared_layers
    else:
        spec = drafts.DraftSpec(1, (init,), shared_layers=n_shared)
        draft = drafts.build_draft(target, spec)
    # Train the own layer in float32; shared tensors and layers stay frozen bf16.
    own_layers = draft.model.layers[n_shared:]
    own_layers.float()
    for prm in draft.parameters():
        prm.requires_grad_(False)
    for prm in own_layers.parameters():
        prm.requires_grad_(True)
    before = agreement_cast(draft, held)
    print(f"held-out mean sum min(p,q) before training: {before:.4f}")

    params = [p for p in draft.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)
    budget = args.minutes_train * 60
    t0 = time.perf_counter()
    step, losses = 0, []
    while time.perf_counter() - t0 < budget:
        frac = (time.perf_counter() - t0) / budget
        for g in opt.param_groups:  # warmup then cosine, by wall-clock fraction
            g["lr"] = args.lr * min(1.0, (step + 1) / 20) * 0.5 * (1 + math.cos(math.pi * frac))
        batch = rng.sample(train, args.seq_per_step)
        loss = 0.0
        opt.zero_grad(set_to_none=True)
        for s in batch:
            ids = s["ids"][None]
            hidden = forward_hidden(draft, ids)[0, s["n_prompt"] - 1:-1]
            logits = draft.lm_head(hidden.to(torch.bfloat16)).float()
            mask = torch.ones(logits.shape[0])
            li = coarse_kl_loss(logits, s["idx"], s["logp"], mask) / len(batch)
            li.backward()
            loss += li.item()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        losses.append(loss)
        step += 1
        if step % 20 == 0:
            print(f"step {step} loss {sum(losses[-20:]) / 20:.4f} "
                  f"({time.perf_counter() - t0:.0f}/{budget:.0f} s)", flush=True)
    own_layers.to(torch.bfloat16)
    after = agreement_cast(draft, held)
    print(f"held-out mean sum min(p,q) after training: {after:.4f} ({step} steps)")
    meta = {"steps": step, "corpus_positions": n_tok, "heldout_agreement_before": round(before, 4),
            "heldout_agreement_after": round(after, 4), "init_layer": init,
            "shared_layers": n_shared, "resumed_from": str(args.resume) if args.resume else None,
            "minutes_total": round((time.perf_counter() - t_start) / 60, 1),
            "command": "python scripts/train_draft.py "
            + " ".join(sys.argv[1:] if argv is None else argv)}
    path = drafts.save_draft(draft, spec, args.out, meta, head_tokens=ranking)
    print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB); meta {json.dumps(meta)}")
    return 0


def forward_hidden(draft, ids):
    """Final-normed hidden states of the draft (float32 layer, bf16 shared embeddings/norm)."""
    m = draft.model
    h = m.embed_tokens(ids)
    pos = torch.arange(ids.shape[1])[None]
    for layer in m.layers:
        dtype = next(layer.parameters()).dtype
        h = h.to(dtype)
        cos, sin = m.rotary_emb(h, pos)
        if not next(layer.parameters()).requires_grad:
            with torch.no_grad():  # shared frozen target layers: no graph
                h = layer(h, attention_mask=None, position_embeddings=(cos, sin), position_ids=pos)
        else:
            h = layer(h, attention_mask=None, position_embeddings=(cos, sin), position_ids=pos)
        h = h[0] if isinstance(h, tuple) else h
    return m.norm(h.to(torch.bfloat16))


@torch.no_grad()
def agreement_cast(draft, data):
    dtype = next(draft.model.layers[-1].parameters()).dtype
    if dtype == torch.bfloat16:
        return agreement(draft, data)
    tot, n = 0.0, 0
    for s in data[:24]:
        hidden = forward_hidden(draft, s["ids"][None])[0, s["n_prompt"] - 1:-1]
        q = torch.softmax(draft.lm_head(hidden).float(), -1)
        p = s["logp"].float().exp()
        tot += torch.minimum(p, q.gather(-1, s["idx"].long())).sum().item()
        n += q.shape[0]
    return tot / max(n, 1)


if __name__ == "__main__":
    raise SystemExit(main())
