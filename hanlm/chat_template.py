"""The chat template over the role and end-of-turn tokens the tokenizer reserves from the start.

    <|system|>\\n...<|eot|>\\n<|user|>\\n...<|eot|>\\n<|assistant|>\\n...<|eot|>\\n

The assistant's content and its end-of-turn token sit inside `{% generation %}` so that
`apply_chat_template(..., return_assistant_tokens_mask=True)` marks exactly what SFT trains on,
the end-of-turn token included: a model never trained to emit it never ends its answers.
"""

SYSTEM = "<|system|>"
USER = "<|user|>"
ASSISTANT = "<|assistant|>"
END_OF_TURN = "<|eot|>"
ROLE_TOKENS = {"system": SYSTEM, "user": USER, "assistant": ASSISTANT}

# Files of a tokenizer folder that carry the template and the reserved tokens' ids
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
SPECIAL_TOKENS_FILE = "special_tokens.json"

CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] not in ['system', 'user', 'assistant'] -%}"
    "{{ raise_exception('unknown chat role: ' + message['role']) }}"
    "{%- endif -%}"
    "{%- if message['role'] == 'assistant' -%}"
    "{{ '" + ASSISTANT + "\\n' }}"
    "{%- generation -%}{{ message['content'] + '" + END_OF_TURN + "' }}{%- endgeneration -%}"
    "{{ '\\n' }}"
    "{%- else -%}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + '" + END_OF_TURN + "\\n' }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '" + ASSISTANT + "\\n' }}{%- endif -%}"
)
