// Counts words with lodash, stamps the answer with dayjs and tags it with a uuid.
const _ = require('lodash');
const dayjs = require('dayjs');
const { v4: uuid } = require('uuid');

module.exports = {
  main: function (event) {
    const text = typeof event.data === 'string' ? event.data : JSON.stringify(event.data || '');
    return {
      id: uuid(),
      at: dayjs().toISOString(),
      counts: _.countBy(_.words(text.toLowerCase())),
    };
  },
};
