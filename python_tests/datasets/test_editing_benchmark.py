"""factkernels.datasets.editing_benchmark: shipped relations, known and invented facts, seeded disjoint draws."""

from collections import Counter

import pytest

from factkernels.datasets import editing_benchmark as eb


def test_relations_have_split_templates_and_prefixes():
    rels = eb.relations()
    assert len(rels) >= 10
    for rel in rels.values():
        templates = rel.edit + rel.held_out
        assert len(templates) >= 8 and len(rel.edit) >= 4 and len(rel.held_out) >= 4
        assert not set(rel.edit) & set(rel.held_out)
        assert all(t.count("{}") == 1 and not t.endswith("{}") for t in templates)
    edit, held = eb.prefixes("edit"), eb.prefixes("held_out")
    assert len(edit) + len(held) >= 10 and not set(edit) & set(held)
    with pytest.raises(ValueError, match="split must be one of"):
        eb.prefixes("test")


def test_candidates_and_known_facts():
    candidates = eb.known_fact_candidates()
    assert len(candidates) >= 2000
    assert len({f.relation for f in candidates}) >= 10
    assert len({(f.relation, f.subject) for f in candidates}) == len(candidates)
    assert set(f.relation for f in candidates) == set(eb.relations())
    known = eb.known_facts()
    assert 100 <= len(known) < len(candidates)
    assert {k.fact for k in known} <= set(candidates)
    rels = eb.relations()
    for k in known:
        assert len(k.edit_correct) == len(rels[k.fact.relation].edit)
        assert len(k.held_out_correct) == len(rels[k.fact.relation].held_out)
        assert eb.is_known(k.edit_correct)
    assert eb.is_known((False, True, False)) and not eb.is_known((False, False, False))


def test_known_draws_are_disjoint_counterfactual_and_seeded():
    draws = [eb.known_draw("validation")] + [eb.known_draw("test", i) for i in range(eb.NUM_TEST_DRAWS)]
    subjects = [{c.subject for c in d} for d in draws]
    for i in range(len(draws)):
        for j in range(i + 1, len(draws)):
            assert not subjects[i] & subjects[j]
    assert sum(len(d) for d in draws) == len(eb.known_facts())
    assert [c for c in eb.known_draw("test", 1)] == draws[2]
    assert eb.known_draw("test", 1, n=7) == draws[2][:7]
    rels = eb.relations()
    triples = {(k.fact.relation, k.fact.subject, k.fact.object) for k in eb.known_facts()}
    for draw, own in zip(draws, subjects):
        for c in draw:
            assert c.target_new != c.target_true and c.target_new in eb.object_pool(c.relation)
            assert c.edit_prompts == rels[c.relation].edit and c.paraphrase_prompts == rels[c.relation].held_out
            assert len(c.neighbours) == 5
            same = [nb for nb in c.neighbours if (c.relation, nb.subject, nb.target) in triples]
            assert len(same) == min(5, sum(k.fact.relation == c.relation and k.fact.subject not in own
                                           and k.fact.object != c.target_new for k in eb.known_facts()))
            for nb in c.neighbours:
                assert nb.subject not in own and nb.target != c.target_new
    with pytest.raises(ValueError, match="test draw index"):
        eb.known_draw("test", eb.NUM_TEST_DRAWS)
    with pytest.raises(ValueError, match="split must be one of"):
        eb.known_draw("train")


def test_all_test_draws_at_once_keep_their_cases_and_take_neighbours_from_outside():
    draws = [eb.known_draw("test", i) for i in range(eb.NUM_TEST_DRAWS)]
    union = eb.all_test_draws("known")
    assert len(union) == sum(map(len, draws))
    assert [c.subject for c in union[:6]] == [d[k].subject for k in range(2) for d in draws]  # each draw in turn
    own = {(c.subject, c.target_new) for d in draws for c in d}
    assert {(c.subject, c.target_new) for c in union} == own  # the draws' own cases and targets
    edited = {c.subject for c in union}
    validation = {c.subject for c in eb.known_draw("validation")}
    for c in union:
        assert len(c.neighbours) == 5
        assert all(nb.subject in validation and nb.subject not in edited and nb.target != c.target_new
                   for nb in c.neighbours)
    assert eb.all_test_draws("known", n=7) == union[:7] and eb.all_test_draws("known") == union  # seeded
    new = eb.all_test_draws("new", n=5)
    assert [c.subject for c in new] == [eb.new_knowledge_draw("test", i, n=2)[k].subject for k in range(2)
                                        for i in range(eb.NUM_TEST_DRAWS)][:5]
    assert new[3] == eb.new_knowledge_draw("test", 0, n=2)[1]  # invented cases kept whole: neighbours never edited
    with pytest.raises(ValueError, match="n must be an int"):
        eb.all_test_draws("known", n=len(union) + 1)
    with pytest.raises(ValueError, match="kind must be"):
        eb.all_test_draws("old")


def test_invented_facts_are_new_unique_and_seeded():
    facts = eb.invented_facts(2000)
    assert facts == eb.invented_facts(2000)
    assert facts[:100] == eb.invented_facts(100)
    assert facts != eb.invented_facts(2000, seed=1)
    known_subjects = {f.subject.lower() for f in eb.known_fact_candidates()}
    assert len({f.subject for f in facts}) == len(facts)
    assert not {f.subject.lower() for f in facts} & known_subjects
    counts = Counter(f.relation for f in facts)
    assert set(counts) == set(eb.relations()) and max(counts.values()) - min(counts.values()) <= 1
    assert all(f.object in eb.object_pool(f.relation) for f in facts)


def test_new_knowledge_draws_are_disjoint_slices():
    val = eb.new_knowledge_draw("validation", n=50)
    test = eb.new_knowledge_draw("test", 0, n=50)
    assert len(val) == len(test) == 50 and not {c.subject for c in val} & {c.subject for c in test}
    assert all(not c.known and c.target_new != c.target_true for c in val + test)
    full = eb.invented_facts(eb.NEW_VALIDATION_FACTS + eb.NUM_TEST_DRAWS * eb.NEW_TEST_FACTS)
    assert len({f.subject for f in full}) == len(full) >= 10_000
    assert test[0].subject == full[eb.NEW_VALIDATION_FACTS].subject
    with pytest.raises(ValueError, match="n must be an int"):
        eb.new_knowledge_draw("validation", n=eb.NEW_VALIDATION_FACTS + 1)
