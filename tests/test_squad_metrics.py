"""The official SQuAD v1.1 / v2.0 evaluation (albert_hf.metrics.squad) against hand-worked examples."""

import json

import pytest

from albert_hf.metrics.squad import (
    exact_match_v1,
    f1_v1,
    f1_v2,
    find_best_threshold,
    golds_from_official_json,
    main,
    normalize_answer,
    squad_v1_metrics,
    squad_v2_metrics,
)


def test_normalisation_lowercases_drops_punctuation_then_articles_and_collapses_spaces():
    assert normalize_answer("The  Quick, brown-fox!") == "quick brownfox"
    assert normalize_answer("An apple a day") == "apple day"
    assert normalize_answer("Atlanta, theatre") == "atlanta theatre"  # articles only as whole words
    # punctuation goes first, so "a." becomes the article "a" and is dropped
    assert normalize_answer("Plan a.") == "plan"


def test_v1_exact_match_and_f1_by_hand():
    # "the cat sat" -> [cat, sat]; "cat sat on mat" -> [cat, sat, on, mat]: P = 2/2, R = 2/4, F1 = 2/3
    assert not exact_match_v1("the cat sat", "cat sat on mat")
    assert f1_v1("the cat sat", "cat sat on mat") == pytest.approx(2 / 3)
    assert exact_match_v1("The Broncos.", "broncos")
    # repeated tokens count with multiplicity: [x, x] vs [x] shares one: P 1/2, R 1, F1 2/3
    assert f1_v1("x x", "x") == pytest.approx(2 / 3)


def test_v1_and_v2_differ_on_empty_answers():
    assert f1_v1("", "") == 0.0  # v1.1: nothing shared scores 0
    assert f1_v2("", "") == 1.0  # v2.0: no-answer agrees with no-answer
    assert f1_v2("", "Paris") == 0.0
    assert f1_v2("the", "") == 1.0  # "the" normalises to nothing, i.e. a no-answer


def test_v1_takes_the_best_gold_and_scores_missing_predictions_zero():
    golds = {"a": ["Denver Broncos", "x y"], "b": ["z"]}
    # a: "x" vs "x y" -> P 1, R 1/2, F1 2/3 (better than vs "Denver Broncos"); b missing -> 0, still counted
    result = squad_v1_metrics(golds, {"a": "x"})
    assert result["exact_match"] == 0.0
    assert result["f1"] == pytest.approx(100 * (2 / 3) / 2)
    assert squad_v1_metrics(golds, {"a": "broncos denver", "b": "Z"}) == {"exact_match": 50.0, "f1": 100.0}


def test_v1_refuses_a_question_without_gold_answers():
    with pytest.raises(ValueError, match="'q' has no gold answer"):
        squad_v1_metrics({"q": []}, {"q": ""})


def test_v2_overall_and_has_ans_no_ans_breakdown_by_hand():
    golds = {"a": ["Paris"], "b": [], "c": ["blue whale"]}
    predictions = {"a": "paris", "b": "", "c": "whale"}
    result = squad_v2_metrics(golds, predictions)
    # exact a 1, b 1, c 0; f1 a 1, b 1, c: P 1, R 1/2 -> 2/3
    assert result["exact"] == pytest.approx(200 / 3)
    assert result["f1"] == pytest.approx(100 * (2 + 2 / 3) / 3)
    assert result["total"] == 3
    assert (result["HasAns_exact"], result["HasAns_f1"], result["HasAns_total"]) == (
        50.0,
        pytest.approx(100 * (1 + 2 / 3) / 2),
        2,
    )
    assert (result["NoAns_exact"], result["NoAns_f1"], result["NoAns_total"]) == (100.0, 100.0, 1)
    assert "best_f1" not in result  # only with no-answer probabilities


def test_v2_gold_answers_that_normalise_to_nothing_mean_no_answer():
    # answerable by the file (it has answers), but "The" normalises to "": the only gold becomes ""
    result = squad_v2_metrics({"q": ["The"]}, {"q": ""})
    assert result["exact"] == 100.0 and result["HasAns_total"] == 1


def test_v2_no_answer_probability_above_the_threshold_scores_as_no_answer():
    golds = {"a": ["x"], "b": [], "c": ["y"]}
    predictions = {"a": "x", "b": "z", "c": "y"}
    na_probs = {"a": 0.1, "b": 0.9, "c": 0.5}
    result = squad_v2_metrics(golds, predictions, na_probs, na_prob_thresh=0.4)
    # a kept (1); b above -> scored as "" on a no-answer question (1); c above -> "" on an answerable one (0)
    assert result["exact"] == pytest.approx(200 / 3)
    assert result["f1"] == pytest.approx(200 / 3)


def test_best_threshold_sweep_by_hand():
    golds = {"a": ["x"], "b": [], "c": ["y"], "d": []}
    predictions = {"a": "x", "b": "z", "c": "y w", "d": "v"}  # every question answered (pass 1)
    na_probs = {"a": 0.1, "c": 0.3, "b": 0.35, "d": 0.9}
    # start: all "" -> 2 points (b, d). Walk by na_prob: a +1 -> 3; c +0 (exact) / +2/3 (f1); b -1; d -1.
    exact = {"a": 1, "b": 0, "c": 0, "d": 0}
    f1 = {"a": 1, "b": 0, "c": 2 / 3, "d": 0}
    has_answer = {"a": True, "b": False, "c": True, "d": False}
    assert find_best_threshold(predictions, exact, na_probs, has_answer) == (75.0, 0.1)
    best_f1, threshold = find_best_threshold(predictions, f1, na_probs, has_answer)
    assert best_f1 == pytest.approx(100 * (3 + 2 / 3) / 4) and threshold == 0.3
    result = squad_v2_metrics(golds, predictions, na_probs)
    assert (result["best_exact"], result["best_exact_thresh"]) == (75.0, 0.1)
    assert (result["best_f1"], result["best_f1_thresh"]) == (pytest.approx(100 * (3 + 2 / 3) / 4), 0.3)
    # na_prob_thresh 1.0 (the default) leaves every prediction as it is: a 1, others 0
    assert result["exact"] == 25.0


def test_v2_names_missing_predictions_and_probabilities():
    with pytest.raises(ValueError, match="no prediction.*'b'"):
        squad_v2_metrics({"a": ["x"], "b": []}, {"a": "x"})
    with pytest.raises(ValueError, match="no no-answer probability"):
        squad_v2_metrics({"a": ["x"]}, {"a": "x"}, na_probs={})


def test_command_line_on_official_files(tmp_path, capsys):
    data = {
        "version": "v2.0",
        "data": [
            {
                "title": "t",
                "paragraphs": [
                    {
                        "context": "Paris is big.",
                        "qas": [
                            {
                                "id": "a",
                                "question": "Where?",
                                "answers": [{"text": "Paris", "answer_start": 0}],
                                "is_impossible": False,
                            },
                            {"id": "b", "question": "Why?", "answers": [], "is_impossible": True},
                        ],
                    }
                ],
            }
        ],
    }
    (tmp_path / "dev.json").write_text(json.dumps(data))
    (tmp_path / "pred.json").write_text(json.dumps({"a": "Paris", "b": "big"}))
    (tmp_path / "odds.json").write_text(json.dumps({"a": -1.0, "b": 2.0}))
    assert golds_from_official_json(data) == {"a": ["Paris"], "b": []}
    result = main(
        [str(tmp_path / "dev.json"), str(tmp_path / "pred.json"), "--na-prob-file", str(tmp_path / "odds.json")]
    )
    # b's odds 2.0 > 1.0: scored as no-answer, which is right for b
    assert result["exact"] == 100.0 and result["NoAns_exact"] == 100.0
    assert json.loads(capsys.readouterr().out)["total"] == 2

    data["version"] = "1.1"
    data["data"][0]["paragraphs"][0]["qas"].pop()  # v1.1 has no unanswerable questions
    data["data"][0]["paragraphs"][0]["qas"].append(
        {"id": "c", "question": "What?", "answers": [{"text": "big", "answer_start": 9}]}
    )
    (tmp_path / "dev11.json").write_text(json.dumps(data))
    (tmp_path / "pred11.json").write_text(json.dumps({"a": "the Paris"}))
    result = main([str(tmp_path / "dev11.json"), str(tmp_path / "pred11.json")])
    assert result == {"exact_match": 50.0, "f1": 50.0}  # c unanswered: 0, counted
    assert "Unanswered question c will receive score 0." in capsys.readouterr().err
