"""The evaluation prompts match the reference harnesses' formats character for character."""
from tinyvllm.evaluation.prompts import (ANSWER_PREFIX, GPQA_CONTINUATIONS, MMLU_CONTINUATIONS, chat_messages,
                                         mmlu_description,
                                         gpqa_prompt, loglikelihood_prompt, mmlu_prompt)
from tinyvllm.evaluation.tasks import Question, load_mmlu, mmlu_dev_by_subject


def first_abstract_algebra():
    test = load_mmlu()
    q = test[0]
    assert q.id == "abstract_algebra/0"
    return q, mmlu_dev_by_subject()["abstract_algebra"]


def test_mmlu_zero_shot_is_lm_eval_format():
    # lm-eval's mmlu task: description (always, also 0-shot) + doc_to_text
    # "{{question.strip()}}\nA. {{choices[0]}}\nB. {{choices[1]}}\nC. {{choices[2]}}\nD. {{choices[3]}}\nAnswer:"
    q, _ = first_abstract_algebra()
    expected = ("The following are multiple choice questions (with answers) about abstract algebra.\n\n"
                "Find the degree for the given field extension Q(sqrt(2), sqrt(3), sqrt(18)) over Q.\n"
                "A. 0\nB. 4\nC. 2\nD. 6\nAnswer:")
    text, continuations = loglikelihood_prompt(q)
    assert text == expected
    assert continuations == (" A", " B", " C", " D") == MMLU_CONTINUATIONS


def test_mmlu_few_shot_is_lm_eval_format():
    # each shot: doc_to_text + target_delimiter " " + letter + fewshot_delimiter "\n\n" (first_n dev examples)
    q, dev = first_abstract_algebra()
    expected = ("The following are multiple choice questions (with answers) about abstract algebra.\n\n"
                "Find all c in Z_3 such that Z_3[x]/(x^2 + c) is a field.\n"
                "A. 0\nB. 1\nC. 2\nD. 3\nAnswer: B\n\n"
                "Statement 1 | If aH is an element of a factor group, then |aH| divides |a|. Statement 2 | If H and "
                "K are subgroups of G then HK is a subgroup of G.\n"
                "A. True, True\nB. False, False\nC. True, False\nD. False, True\nAnswer: B\n\n"
                "Find the degree for the given field extension Q(sqrt(2), sqrt(3), sqrt(18)) over Q.\n"
                "A. 0\nB. 4\nC. 2\nD. 6\nAnswer:")
    assert mmlu_prompt(q, dev[:2]) == expected
    five = mmlu_prompt(q, dev[:5])
    question = mmlu_prompt(q)[len(mmlu_description(q.subject)):]
    assert five.count("\nAnswer:") == 6 and five.count("\n\n") == 6 and five.endswith("\n\n" + question)


def test_mmlu_question_is_stripped_choices_are_not():
    q = Question("mmlu", "x/0", "high_school_us_history", "  Why?\n", (" a ", "b", "c", "d"), 2)
    assert mmlu_prompt(q) == ("The following are multiple choice questions (with answers) about high school us "
                              "history.\n\nWhy?\nA.  a \nB. b\nC. c\nD. d\nAnswer:")


def test_gpqa_prompt_is_lm_eval_zeroshot_format():
    q = Question("gpqa_diamond", "rec1", "Physics", " What is x? ", ("1 ", "two  words", "a [title] b", "4"), 0)
    assert gpqa_prompt(q) == ("What is the correct answer to this question: What is x? \nChoices:\n"
                              "(A) 1\n(B) two words\n(C) a. b\n(D) 4\nAnswer:")
    assert loglikelihood_prompt(q)[1] == GPQA_CONTINUATIONS == (" (A)", " (B)", " (C)", " (D)")


def test_chat_prompt_is_meta_style_with_shots_as_turns():
    q, dev = first_abstract_algebra()
    messages = chat_messages(q, dev[:1])
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert messages[1]["content"] == "The best answer is B."
    assert messages[2]["content"] == (
        "Given the following question and four candidate answers (A, B, C and D), choose the best answer.\n"
        "Find the degree for the given field extension Q(sqrt(2), sqrt(3), sqrt(18)) over Q.\n"
        "A. 0\nB. 4\nC. 2\nD. 6\n"
        'Your response should end with "The best answer is [the_answer_letter]" where the [the_answer_letter] '
        "is one of A, B, C or D.")
    assert ANSWER_PREFIX == "The best answer is"
